import threading, _thread, time, sys
from collections import deque
Q=int(sys.argv[1]); GPU=float(sys.argv[2])*1e-6; W=int(sys.argv[3]) if len(sys.argv)>3 else 1
si=float(sys.argv[4]) if len(sys.argv)>4 else 0
if si: sys.setswitchinterval(si)
q=deque(); lk=threading.Lock(); cv=threading.Condition(lk)
stop=False; done=[0]; sizes=[]
def worker():
    while not stop:
        with lk:
            while not q and not stop: cv.wait(0.1)
            b=list(q); q.clear()
        if not b: continue
        sizes.append(len(b))
        time.sleep(GPU)
        for r in b: r[1]=1; r[0].release()
def client():
    while not stop:
        l=_thread.allocate_lock(); l.acquire(); r=[l,None]
        with lk:
            q.append(r); cv.notify()
        l.acquire()
        done[0]+=1
ws=[threading.Thread(target=worker,daemon=True) for _ in range(W)]
cs=[threading.Thread(target=client,daemon=True) for _ in range(Q)]
for t in ws+cs: t.start()
time.sleep(0.3); d0=done[0]; n0=len(sizes)
t0=time.time(); time.sleep(2); d1=done[0]; el=time.time()-t0
sizes=sizes[n0:]
print(Q, GPU*1e6, W, si, "qps", round((d1-d0)/el), "mean batch", round(sum(sizes)/len(sizes),1))
