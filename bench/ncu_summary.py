import csv,sys,collections,re
rows=list(csv.reader(open(sys.argv[1]).readlines()[[i for i,l in enumerate(open(sys.argv[1])) if l.startswith('"ID"')][0]:]))
hdr=rows[0]; K={}
for r in rows[1:]:
    d=dict(zip(hdr,r)); k=int(d["ID"])
    e=K.setdefault(k,{"name":d["Kernel Name"],"grid":d["Grid Size"],"block":d["Block Size"]})
    v=d["Metric Value"].replace(",","")
    try: v=float(v)
    except: pass
    e[d["Metric Name"]]=v
def short(n):
    n=re.sub(r"\(.*","",n); n=n.replace("(anonymous namespace)::","").replace("deepinfer::cuda::","").replace("unnamed>::","")
    return n[:60]
tot=0; agg=collections.OrderedDict()
for k in sorted(K):
    e=K[k]; t=e.get("gpu__time_duration.sum",0)/1e3; b=(e.get("dram__bytes_read.sum",0)+e.get("dram__bytes_write.sum",0))/1e6
    tot+=t
    a=agg.setdefault(short(e["name"]),[0,0,0,e["grid"],e["block"],e.get("launch__registers_per_thread"),[]])
    a[0]+=1;a[1]+=t;a[2]+=b;a[6].append(t)
    if len(sys.argv)>2: print(f'{k:4d} {t:8.2f}us {b:8.2f}MB {b/ max(t,1e-9)*1e-3*1e3/4270*100 if t else 0:5.1f}%HBM {e["grid"]:>14} {e["block"]:>12} r{e.get("launch__registers_per_thread")} occ{e.get("sm__warps_active.avg.pct_of_peak_sustained_active",0):.0f} {short(e["name"])}')
print(f"total kernel time {tot:.1f} us over {len(K)} kernels")
for n,a in sorted(agg.items(),key=lambda x:-x[1][1]):
    print(f'{a[1]:9.1f}us {a[0]:4d}x avg{a[1]/a[0]:7.2f} min{min(a[6]):6.2f} {a[2]:8.1f}MB {a[2]/a[1]*1e3/4270*100 if a[1] else 0:5.1f}%HBM grid{a[3]} blk{a[4]} r{a[5]} {n}')
