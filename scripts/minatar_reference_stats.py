import json, subprocess, sys, random, math
import numpy as np
from minatar import Environment
BIN = "/work/main/target/release/normrl"
N=int(sys.argv[1])
for game in ["breakout","asterix","freeway","seaquest","space_invaders"]:
    env=Environment(game); env.seed(1); rnd=random.Random(1)
    R=[];L=[]
    for ep in range(N if game!="freeway" else N//10):
        env.reset(); r=0;l=0
        while True:
            rew,term=env.act(rnd.randrange(6)); r+=rew; l+=1
            if term or l>=10000: break
        R.append(r);L.append(l)
    out=subprocess.run([BIN,"env","rollout","--env",f"minatar/{game}","--episodes",str(len(R)),"--seed","3","--json"],capture_output=True,text=True).stdout
    rec=[json.loads(x) for x in out.splitlines()]
    R2=[x["return"] for x in rec]; L2=[x["length"] for x in rec]
    def z(a,b):
        a=np.array(a,float);b=np.array(b,float)
        se=math.sqrt(a.var()/len(a)+b.var()/len(b)) or 1
        return (a.mean()-b.mean())/se
    print(f"{game:15s} ref ret {np.mean(R):7.3f} len {np.mean(L):8.1f} | ours ret {np.mean(R2):7.3f} len {np.mean(L2):8.1f} | z ret {z(R,R2):5.2f} len {z(L,L2):5.2f}")
