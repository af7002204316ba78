//! A real single-node Slurm cluster for the tests: Debian's `slurm-wlm` and `munge`
//! (installed with apt-get when missing; that needs root), a munge key and daemons
//! under a temporary directory, `slurmctld` and `slurmd` in the foreground as this
//! process's children. Dropping the cluster cancels its jobs, waits for them to end and
//! stops the daemons by their process ids, also when a test fails. Nothing here is
//! skipped: a cluster that cannot start fails the test and says what is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Cluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
    daemons: Vec<(&'static str, Child)>,
}

/// Where Debian puts the daemons (root's PATH has it; others' may not).
fn sbin(name: &str) -> PathBuf {
    Path::new("/usr/sbin").join(name)
}

/// Installs slurm-wlm and munge unless they are there (idempotent).
fn install() {
    if sbin("slurmctld").exists() && sbin("munged").exists() {
        return;
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    let packages = ["install", "-y", "-q", "slurm-wlm", "munge"];
    if !apt(&packages) {
        // A fresh machine may have no package lists yet.
        let _ = apt(&["update", "-q"]);
        assert!(
            apt(&packages),
            "Slurm is missing and `apt-get install -y slurm-wlm munge` failed (it needs root and Debian's package lists): cannot run the Slurm tests"
        );
    }
}

fn spawn(
    what: &'static str,
    program: PathBuf,
    args: &[String],
    log: &Path,
) -> (&'static str, Child) {
    let out = std::fs::File::create(log).unwrap();
    let child = Command::new(&program)
        .args(args)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what} ({}): {e}", program.display()));
    (what, child)
}

impl Cluster {
    /// A cluster whose daemons listen on `port` and `port + 1`.
    pub fn start(name: &str, port: u16) -> Cluster {
        install();
        let dir = std::env::temp_dir().join(format!("normrl-slurm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["state", "spool", "munge"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let mut key = vec![0u8; 1024];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut key)
            .unwrap();
        let key_file = dir.join("munge/munge.key");
        std::fs::write(&key_file, key).unwrap();
        set_mode(&key_file, 0o600);
        set_mode(&dir.join("munge"), 0o711);
        let socket = dir.join("munge/socket");
        let mut cluster = Cluster {
            conf: dir.join("slurm.conf"),
            dir: dir.clone(),
            daemons: vec![],
        };
        let path = |p: &str| dir.join(p).display().to_string();
        cluster.daemons.push(spawn(
            "munged",
            sbin("munged"),
            &[
                "--foreground".into(),
                "--force".into(),
                format!("--key-file={}", key_file.display()),
                format!("--socket={}", socket.display()),
                format!("--pid-file={}", path("munge/pid")),
                format!("--log-file={}", path("munge/log")),
                format!("--seed-file={}", path("munge/seed")),
            ],
            &dir.join("munged.out"),
        ));
        cluster.wait_for("the munge socket", Duration::from_secs(10), || {
            socket.exists()
        });
        std::fs::write(&cluster.conf, config(&dir, &socket, port)).unwrap();
        let conf = cluster.conf.display().to_string();
        let foreground = vec!["-D".to_string(), "-f".to_string(), conf];
        cluster.daemons.push(spawn(
            "slurmctld",
            sbin("slurmctld"),
            &foreground,
            &dir.join("slurmctld.out"),
        ));
        cluster.daemons.push(spawn(
            "slurmd",
            sbin("slurmd"),
            &foreground,
            &dir.join("slurmd.out"),
        ));
        cluster.wait_for(
            "the node to be idle in sinfo",
            Duration::from_secs(60),
            || {
                let out = cluster.run("sinfo", &["-h", "-o", "%T"]);
                String::from_utf8_lossy(&out.stdout).trim() == "idle"
            },
        );
        cluster
    }

    /// A Slurm client command against this cluster (`SLURM_CONF` set).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
    }

    /// Polls `done` every 200 ms for up to `limit`; on a timeout, panics with the
    /// daemons' logs.
    pub fn wait_for(&self, what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "timed out after {limit:?} waiting for {what}\n{}",
            self.logs()
        );
    }

    /// The tail of every daemon's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for log in ["munged.out", "slurmctld.out", "slurmd.out"] {
            let text = std::fs::read_to_string(self.dir.join(log)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {log}\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        out
    }

    /// Jobs still known to the controller (pending or running).
    pub fn queue(&self) -> String {
        String::from_utf8_lossy(&self.run("squeue", &["-h", "-o", "%i %T %r"]).stdout).into_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Jobs first, so that no job step outlives the daemons.
        let _ = self.run("scancel", &["--user", "root"]);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) && !self.queue().trim().is_empty() {
            std::thread::sleep(Duration::from_millis(200));
        }
        for (_, child) in self.daemons.iter_mut().rev() {
            // Child::kill signals the process id this test started.
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A one-node cluster on this machine, run by root without systemd or cgroups, at
/// 127.0.0.1 (a container's host name need not resolve). Job
/// credentials expire after 10 s instead of 120 s: a requeued job waits that long
/// before it starts again (sooner, its revoked credential kills it).
fn config(dir: &Path, socket: &Path, port: u16) -> String {
    // The short name slurmd gives itself (`hostname -s`), without needing that tool.
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = name.trim().split('.').next().unwrap().to_string();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let d = dir.display();
    format!(
        "ClusterName=normrltest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket},cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldPort={port}
SlurmdPort={}
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
",
        port + 1,
        socket = socket.display(),
    )
}
