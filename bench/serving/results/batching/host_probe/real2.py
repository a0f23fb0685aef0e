import sys, time, threading
sys.path.insert(0, '.')
import torch, numpy as np
from recsys_doctor.runtime._batcher import Batcher
from recsys_doctor.runtime._batched import Arena
from recsys_doctor.runtime._batchspec import BatchPlan, infer_spec
Q=int(sys.argv[1]); W=int(sys.argv[2]); MODE=sys.argv[3]
B=256
def mk():
    dense=torch.randn(B,13); idx=[torch.randint(0,1000,(B,)) for _ in range(26)]; offs=torch.arange(B)
    return [dense,*idx,offs]
qs=[mk() for _ in range(Q)]
plan=BatchPlan(qs[0], infer_spec(qs[0]))
arena=Arena(plan, 256, pin=False)
out=np.zeros((32,B,1),dtype=np.float32)
npviews=[[v.numpy() for v in vs] for vs in arena.views]
def stage_np(slot, leaves):
    for d,s in zip(npviews[slot], leaves): np.copyto(d, s.numpy())
class FakeWorker:
    def __call__(self, reqs):
        n=len(reqs)
        if MODE=='worker':
            dst=[]; src=[]
            for r in reqs: dst+=arena.views[r.slot]; src+=r.leaves
            torch._foreach_copy_(dst,src)
        time.sleep((221+9*n)*1e-6)          # the GPU
        p=out[:n].copy()
        fn=torch.from_numpy
        return [fn(p[j]) for j in range(n)]
stage={'client':arena.stage,'worker':(lambda s,l:None),'np':stage_np,'none':(lambda s,l:None)}[MODE]
b=Batcher([FakeWorker() for _ in range(W)], max_batch=32, stage=stage, max_queue=256)
cnt=[0]; stop=[False]
def client(k):
    call=b.call; l=qs[k]
    while not stop[0]:
        call(l); cnt[0]+=1
ths=[threading.Thread(target=client,args=(k,),daemon=True) for k in range(Q)]
for t in ths: t.start()
time.sleep(0.5); c0=cnt[0]; s0=b.stats.sizes(); t0=time.time(); time.sleep(3); c1=cnt[0]; el=time.time()-t0
stop[0]=True
s1=b.stats.sizes(); d={k:s1[k]-s0.get(k,0) for k in s1}
nb=sum(d.values()); nr=sum(k*v for k,v in d.items())
print(f"{MODE} Q={Q} W={W} qps={(c1-c0)/el:.0f} mean_batch={nr/max(nb,1):.1f}", flush=True)
import os; os._exit(0)
