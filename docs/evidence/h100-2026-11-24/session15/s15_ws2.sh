S15_VARIANTS=ws-m128n128w8s3,m128n128w8s3,m128n128w8s4,ws-m128n128w8s4,ws-m128n64w8s3,m128n64w8s3 python3 scratch/s15_ws.py --out $W/s15_ws2.json
