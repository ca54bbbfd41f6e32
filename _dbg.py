from vpp.schedules import *
from vpp.schedules.packing import build_vpp_packed
cost=LinearCost(latency=0.819975077803131, seconds_per_token=0.0, overlap=0.14713178947412098, stage_weights=None, per_chunk=0.3268006576996654, per_token=0.01, per_token_prefix=0.0005126124990051064)
lay=make_layout("v",8+1,4)
reqs=[Request(0,(27, 13, 8, 38, 19, 51))]
a=build_vpp_async(lay,reqs); b=build_vpp_packed(lay,reqs); c=build_vpp_packed(lay,reqs,cost=cost)
print([p.computes(r)==a.computes(r) for p in (b,c) for r in range(4)])
for p in (a,b,c):
    tr=simulate(p,cost); s=summarize(tr); print(p.name, tr.makespan, s.exposed_comm, s.bubble)
print(a.format_grid(start=0, stop=14)); print(b.format_grid(start=0,stop=14))
