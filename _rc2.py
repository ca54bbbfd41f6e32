import random
from vpp.schedules import *
from vpp.schedules.packing import build_vpp_packed, packed_chunks
rng=random.Random(1)
from collections import defaultdict
stats=defaultdict(list); worst=[]
for trial in range(300):
    kind=rng.choice(["v","v","interleaved"]); P=rng.randint(1,4); f=rng.randint(1,2)
    lay=make_layout(kind, 2*f*P+rng.randint(0,3), P, folds=f)
    reqs=[Request(i, tuple(rng.randint(1,64) for _ in range(rng.randint(1,6))), rng.choice([0.0, rng.uniform(0,300)])) for i in range(rng.randint(1,4))]
    reqs.sort(key=lambda q:q.arrival)
    K=rng.choice([None,1,2,3])
    cost=LinearCost(per_chunk=rng.uniform(0,2), per_token=0.01, per_token_prefix=rng.uniform(0,1e-3), latency=rng.uniform(0,1), overlap=rng.uniform(0,1))
    usecost=rng.random()<0.5
    comm="async"
    p=build_vpp_packed(lay, reqs, cost=cost if usecost else None, concurrency=K); verify(p); verify(p,semantics="blocking"); verify(p,semantics="serial")
    tr=simulate(p,cost,check=False)
    a=build_vpp_async(lay,reqs,concurrency=K) if comm=="async" else build_vpp(lay,reqs,concurrency=K)
    ta=simulate(a,cost)
    g=(ta.makespan-tr.makespan)/ta.makespan
    stats[(kind,usecost,comm)].append(g)
    if g<-0.01: worst.append((g,kind,P,f,usecost,comm,K,[ (q.chunk_sizes,round(q.arrival)) for q in reqs], packed_chunks(p), cost))
for k,v in sorted(stats.items()): print(k, len(v), round(min(v),3), round(max(v),3), sum(x<-1e-9 for x in v))
for w in sorted(worst, key=lambda w: w[0])[:6]: print(w)
