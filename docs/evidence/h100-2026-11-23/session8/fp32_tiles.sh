# float32 tiles before (commit a2312b3's default_config) and after the cap, side by side; the new tiles checked by the oracle
python3 tools/tiles_side_by_side.py --dtype fp32 --shapes B4-H32-N4096-D64 --tiles default,64x64 --check default --out $W/tiles_fp32_d64.json
python3 tools/tiles_side_by_side.py --dtype fp32 --shapes B4-H16-N4096-D128 --tiles default,64x32 --check default --out $W/tiles_fp32_d128.json
