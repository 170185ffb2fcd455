# The grid's N = 1024 and 2048 cells, 87cbf84 (scratch/base87) against this tree, alternating, 3 rounds each.
mkdir -p $W/oldnew
for i in 1 2 3; do
  for side in base head; do
    src=src; [ $side = base ] && src=scratch/base87/src
    PYTHONPATH=$src:/tmp/site python3 -c "
import json
from attnkit_tools.grid import measure
print(json.dumps(measure(seq_lens=(1024, 2048), log=lambda s: None)))" > $W/oldnew/${side}_$i.json 2> $W/oldnew/${side}_$i.err
    echo "$side $i rc=$?" >> $W/oldnew/log.txt
  done
done
