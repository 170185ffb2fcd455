# Decode table with the split-KV sweep (issue 13). W is the results dir.
python3 tools/decode_table.py --out $W/decode_table.json --sweep > $W/decode_table.md 2> $W/decode_table.err
echo "decode_table rc=$?"
