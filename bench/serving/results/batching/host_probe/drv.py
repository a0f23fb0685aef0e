import sys, time, threading, os
sys.path.insert(0, '.')
import torch, numpy as np
from recsys_doctor.runtime._driver import Driver
from recsys_doctor.runtime._batcher import Batcher
from recsys_doctor.runtime._batched import Arena
from recsys_doctor.runtime._batchspec import BatchPlan, infer_spec
Q=int(sys.argv[1]); W=int(sys.argv[2]); MODE=sys.argv[3]; LA=int(sys.argv[4]) if len(sys.argv)>4 else None
B=256
def mk():
    dense=torch.randn(B,13); idx=[torch.randint(0,1000,(B,)) for _ in range(26)]; offs=torch.arange(B)
    return [dense,*idx,offs]
qs=[mk() for _ in range(Q)]
plan=BatchPlan(qs[0], infer_spec(qs[0]))
out=np.zeros((32,B,1),dtype=np.float32)
class FakeWorker:
    def __init__(self):
        host=torch.zeros(32*plan.block,dtype=torch.uint8); self.views=plan.slot_views(host,32); self.m=len(plan.leaves)
    def start(self, reqs):
        n=len(reqs); m=self.m
        if MODE=='fe': torch._foreach_copy_(self.views[:n*m],[x for r in reqs for x in r.leaves])
        self.t=time.perf_counter()+(221+9*n)*1e-6
        return reqs
    def finish(self, reqs):
        d=self.t-time.perf_counter()
        if d>0: time.sleep(d)
        n=len(reqs); p=out[:n].copy(); fn=torch.from_numpy
        return [fn(p[j]) for j in range(n)]
    def __call__(self, reqs):
        self.start(reqs); return self.finish(reqs)
b=Driver([FakeWorker() for _ in range(W)], max_batch=32, max_queue=256, launch_at=LA)
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
print(f"{MODE} Q={Q} W={W} LA={LA} qps={(c1-c0)/el:.0f} mean_batch={nr/max(nb,1):.1f}", flush=True)
os._exit(0)
