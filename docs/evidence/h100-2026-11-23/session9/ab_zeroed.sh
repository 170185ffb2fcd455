# true effect of zeroed-outputs.patch, do_bench side by side (W exported by call_s8.sh)
set -u
d=$(mktemp -d); mkdir -p $d/clean $d/head; cp -r src $d/clean/src; cp -r src $d/head/src
(cd $d/head && patch -s -p1 < $OLDPWD/docs/evidence/gate-changes/zeroed-outputs.patch)
read -r -a words <<< "$(head -1 docs/evidence/gate-changes/zeroed-outputs.patch | sed 's/^# cases: //')"
python3 -m attnkit_tools.ab_dobench --base $d/clean/src --head $d/head/src --match "${words[@]}" --rounds 3 --out $W/ab_zeroed-outputs.json
