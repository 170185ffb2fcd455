mkdir -p $W/baselines && cp -r baselines/nvidia-h100-80gb-hbm3 $W/baselines/; tail -3 $W/verify/log_record.txt
