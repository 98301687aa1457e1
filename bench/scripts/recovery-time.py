# Recovery time after SIGKILL: the per-record flights job (100 ms epochs) is killed at 350 ms,
# restarted, and the time from restart to the first epoch committed by the new attempt is read
# from the epoch log. Needs: cargo build --release -p nop-stream-cli
import subprocess, time, json, os, shutil, signal, statistics
import pathlib; ROOT=pathlib.Path(__file__).resolve().parents[2]; BIN=str(ROOT/"target/release/nopstream"); EX=str(ROOT/"examples/flights")
job=f"{EX}/.m-recovery.toml"
text=open(f"{EX}/flights-per-record.toml").read().replace("checkpoint_interval_ms = 200","checkpoint_interval_ms = 100")
open(job,"w").write(text)
res=[]; full=[]
for rep in range(5):
    w="/tmp/nopstream-recovery-work"; o="/tmp/nopstream-recovery-out"
    shutil.rmtree(w,ignore_errors=True); shutil.rmtree(o,ignore_errors=True)
    args=[BIN,"run","--no-progress","--no-echo","--output",o,"--work-dir",w,job]
    p=subprocess.Popen(args,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
    time.sleep(0.35); p.send_signal(signal.SIGKILL); p.wait()
    t0=time.time()*1000
    p=subprocess.run(args,capture_output=True,text=True)
    t1=time.time()*1000
    log=[json.loads(l) for l in open(f"{w}/checkpoints/flights-per-record.main/epochs.log") if l.strip()]
    att=max(r["attempt"] for r in log)
    first=min(r["at_ms"] for r in log if r["attempt"]==att and r["state"] in ("committed",))
    firstd=min(r["at_ms"] for r in log if r["attempt"]==att and r["state"]=="durable")
    res.append(first-t0); full.append(t1-t0)
    print(f"restart->first durable {firstd-t0:.0f} ms, ->first committed {first-t0:.0f} ms, restart->finished {t1-t0:.0f} ms")
os.remove(job)
print("median restart->first committed epoch:", statistics.median(res), "ms; median restart->finished:", statistics.median(full), "ms")
