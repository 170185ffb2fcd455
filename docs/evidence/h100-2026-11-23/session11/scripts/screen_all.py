import json, sys, itertools
from concurrent.futures import ProcessPoolExecutor
import screen15
C = {
 "fwd": [(64,64,4,3),(64,64,4,4),(64,64,4,5),(64,128,4,2),(64,128,4,3),(128,64,8,3),(128,64,8,4),(128,128,8,2),(128,128,8,3),(64,32,4,4)],
 "dkdv": [(32,64,4,2),(32,64,4,3),(32,64,4,4),(64,64,4,2),(64,64,4,3),(64,128,8,2),(64,128,8,3),(32,128,4,2),(32,128,8,2),(32,128,8,3),(64,64,8,3),(16,64,4,3),(16,128,4,3),(64,128,4,2)],
 "dq": [(64,64,4,3),(64,64,4,4),(128,64,8,2),(128,64,8,3),(128,128,8,2),(128,128,8,3),(64,128,4,2),(64,128,4,3),(128,32,4,3),(64,32,4,3)],
}
def job(a):
    try: return screen15.compile_one(*a)
    except Exception as e: return {"args": a, "failed": type(e).__name__}
if __name__ == "__main__":
    todo=[(k,d,causal,*c,True) for k,cs in C.items() if k in sys.argv[2].split(",") for c in cs for d in (64,128) for causal in (False,)]
    with ProcessPoolExecutor(int(sys.argv[1])) as ex:
        for r in ex.map(job, todo): print(json.dumps(r), flush=True)
