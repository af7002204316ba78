//! One Gymnasium environment in a Python worker process, driven over pipes.
//!
//! The worker (`worker.py`, embedded in this crate) speaks a small binary protocol:
//! observations travel as raw little-endian arrays, requests are a byte and a number.
//! If the worker dies, the next call returns an error carrying its exit status and the
//! last lines it wrote to stderr; nothing waits for ever on a dead process.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::{ActionSpace, Env, EnvError, Frame, ObservationSpace, Step};

const WORKER_SOURCE: &str = include_str!("worker.py");
/// Lines of the worker's stderr kept for error messages.
const STDERR_TAIL: usize = 40;

/// What to start: the Gymnasium id, keyword arguments for `gym.make`, the preset and
/// the Python interpreter.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    pub gym_id: String,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// `Some("atari")`: frameskip 1 + grayscale in the environment, frame skipping
    /// with max-pooling in the worker.
    pub preset: Option<String>,
    pub frame_skip: u32,
    pub python: String,
}

/// The worker script, written once per version to the temporary directory (a file
/// rather than `python -c`, so that `ps` and tracebacks show a name, not the source).
fn worker_script() -> Result<std::path::PathBuf, EnvError> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    WORKER_SOURCE.hash(&mut hasher);
    let path = std::env::temp_dir().join(format!("normrl-gym-worker-{:016x}.py", hasher.finish()));
    if std::fs::read_to_string(&path).ok().as_deref() == Some(WORKER_SOURCE) {
        return Ok(path);
    }
    // Unique per writer, threads included: runs in one process (a comparison's jobs,
    // parallel tests) may write the script at once, and a shared temporary name let one
    // writer's rename take the file from under another's.
    static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let writer = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("{}-{writer}.tmp", std::process::id()));
    std::fs::write(&tmp, WORKER_SOURCE)
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| {
            EnvError::External(format!(
                "cannot write the Gymnasium worker script {}: {e}",
                path.display()
            ))
        })?;
    Ok(path)
}

#[derive(serde::Deserialize)]
struct Header {
    obs_shape: Vec<usize>,
    obs_dtype: String,
    /// `None`: unbounded.
    obs_low: Option<f32>,
    obs_high: Option<f32>,
    n_actions: usize,
    #[serde(default)]
    action_meanings: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Dtype {
    U8,
    F32,
}

pub struct GymProcess {
    id: String,
    spec: WorkerSpec,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    shape: Vec<usize>,
    dtype: Dtype,
    low: f32,
    high: f32,
    n_actions: usize,
    action_meanings: Vec<String>,
    raw: Vec<u8>,
    lives: Option<u32>,
    /// Set once the worker failed: every later call reports the same error.
    dead: Option<EnvError>,
}

impl GymProcess {
    /// Starts the worker and waits for its handshake (or its reason for failing).
    pub fn start(id: &str, spec: WorkerSpec) -> Result<Self, EnvError> {
        let request = serde_json::json!({
            "id": spec.gym_id,
            "kwargs": spec.kwargs,
            "preset": spec.preset,
            "frame_skip": spec.frame_skip,
        });
        let script = worker_script()?;
        let mut child = Command::new(&spec.python)
            .arg("-u")
            .arg(&script)
            .arg(request.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                EnvError::External(format!(
                    "cannot start the Python interpreter '{}' for the Gymnasium bridge ({e}). \
                     Install Python 3 with `pip install gymnasium` (and `ale-py` for Atari), \
                     or name the interpreter with `?python=/path/to/python` in the id or the \
                     NORMRL_PYTHON environment variable",
                    spec.python
                ))
            })?;
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let tail = Arc::clone(&stderr_tail);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = BufReader::with_capacity(1 << 16, child.stdout.take().expect("piped"));
        let mut process = Self {
            id: id.to_string(),
            spec,
            child,
            stdin,
            stdout,
            stderr_tail,
            shape: vec![],
            dtype: Dtype::F32,
            low: 0.0,
            high: 0.0,
            n_actions: 0,
            action_meanings: vec![],
            raw: vec![],
            lives: None,
            dead: None,
        };
        let header: Header = match process.read_tag("starting")? {
            b'H' => {
                let bytes = process.read_block("starting")?;
                serde_json::from_slice(&bytes).map_err(|e| {
                    process.fail(format!("the worker's handshake is malformed: {e}"))
                })?
            }
            tag => return Err(process.error_reply(tag, "starting")),
        };
        process.dtype = match header.obs_dtype.as_str() {
            "uint8" => Dtype::U8,
            _ => Dtype::F32,
        };
        let len: usize = header.obs_shape.iter().product();
        process.raw = vec![0; len * process.dtype_size()];
        process.shape = header.obs_shape;
        process.low = header.obs_low.unwrap_or(f32::NEG_INFINITY);
        process.high = header.obs_high.unwrap_or(f32::INFINITY);
        process.n_actions = header.n_actions;
        process.action_meanings = header.action_meanings;
        Ok(process)
    }

    /// The worker's process id.
    #[cfg(any(test, feature = "test-support"))]
    pub fn worker_pid(&self) -> u32 {
        self.child.id()
    }

    /// The actions' names where the environment has them (ALE: `NOOP`, `FIRE`, ...).
    pub fn action_meanings(&self) -> &[String] {
        &self.action_meanings
    }

    /// Lives left, for games that have them (ALE's `info["lives"]`).
    pub fn lives(&self) -> Option<u32> {
        self.lives
    }

    fn dtype_size(&self) -> usize {
        match self.dtype {
            Dtype::U8 => 1,
            Dtype::F32 => 4,
        }
    }

    /// The worker's exit status if it exits within `polls` x 10 ms.
    fn wait_for_exit(&mut self, polls: u32) -> Option<std::process::ExitStatus> {
        for _ in 0..polls {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        None
    }

    /// An error naming the environment, with the worker's exit status and stderr tail;
    /// the process is marked dead.
    fn fail(&mut self, what: String) -> EnvError {
        // A worker that is exiting gets a moment to finish, so the status is known.
        let status = match self.wait_for_exit(50) {
            Some(s) => format!("exited with {s}"),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                "stopped responding and was killed".to_string()
            }
        };
        let tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        let tail: Vec<&str> = tail.iter().map(String::as_str).collect();
        let error = EnvError::External(format!(
            "the Gymnasium worker for '{}' ({}) {status}: {what}{}",
            self.spec.gym_id,
            self.spec.python,
            if tail.is_empty() {
                String::new()
            } else {
                format!("\nits last stderr lines:\n{}", tail.join("\n"))
            }
        ));
        self.dead = Some(error.clone());
        error
    }

    fn read_exact_or_fail(&mut self, buf: &mut [u8], during: &str) -> Result<(), EnvError> {
        self.stdout
            .read_exact(buf)
            .map_err(|e| self.fail(format!("the connection broke during {during} ({e})")))
    }

    fn read_tag(&mut self, during: &str) -> Result<u8, EnvError> {
        let mut tag = [0u8];
        self.read_exact_or_fail(&mut tag, during)?;
        Ok(tag[0])
    }

    fn read_block(&mut self, during: &str) -> Result<Vec<u8>, EnvError> {
        let mut len = [0u8; 4];
        self.read_exact_or_fail(&mut len, during)?;
        let mut bytes = vec![0; u32::from_le_bytes(len) as usize];
        self.read_exact_or_fail(&mut bytes, during)?;
        Ok(bytes)
    }

    /// Turns an `E` reply (or anything unexpected) into an error.
    fn error_reply(&mut self, tag: u8, during: &str) -> EnvError {
        if tag != b'E' {
            return self.fail(format!("protocol error during {during}: tag {tag}"));
        }
        match self.read_block(during) {
            Ok(bytes) => {
                let message = String::from_utf8_lossy(&bytes).into_owned();
                let error = EnvError::External(format!(
                    "Gymnasium environment '{}' failed during {during}: {message}",
                    self.spec.gym_id
                ));
                // A worker that could not even start has exited; one that failed a step
                // stays up, but the episode is lost, so the caller must reset.
                if during == "starting" {
                    let _ = self.child.wait();
                    self.dead = Some(error.clone());
                }
                error
            }
            Err(e) => e,
        }
    }

    fn request(&mut self, message: &[u8], during: &str, obs: &mut [f32]) -> Result<Step, EnvError> {
        if let Some(e) = &self.dead {
            return Err(e.clone());
        }
        crate::env::check_obs_len(self.raw.len() / self.dtype_size(), obs)?;
        if let Err(e) = self.stdin.write_all(message) {
            return Err(self.fail(format!("cannot send the request for {during} ({e})")));
        }
        let tag = self.read_tag(during)?;
        if tag != b'K' {
            return Err(self.error_reply(tag, during));
        }
        let mut head = [0u8; 14];
        self.read_exact_or_fail(&mut head, during)?;
        let mut raw = std::mem::take(&mut self.raw);
        let read = self.read_exact_or_fail(&mut raw, during);
        self.raw = raw;
        read?;
        let reward = f64::from_le_bytes(head[0..8].try_into().expect("8 bytes"));
        let lives = i32::from_le_bytes(head[10..14].try_into().expect("4 bytes"));
        self.lives = u32::try_from(lives).ok();
        match self.dtype {
            Dtype::U8 => {
                for (o, &b) in obs.iter_mut().zip(&self.raw) {
                    *o = f32::from(b);
                }
            }
            Dtype::F32 => {
                for (o, b) in obs.iter_mut().zip(self.raw.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
        Ok(Step {
            reward: reward as f32,
            terminated: head[8] != 0,
            truncated: head[9] != 0,
        })
    }
}

impl GymProcess {
    /// Asks the worker for `env.render()`: `F`, the height and width (u32 each), and
    /// the RGB bytes.
    fn request_frame(&mut self) -> Result<Frame, EnvError> {
        if let Some(e) = &self.dead {
            return Err(e.clone());
        }
        if let Err(e) = self.stdin.write_all(b"F") {
            return Err(self.fail(format!("cannot send the request for render ({e})")));
        }
        let tag = self.read_tag("render")?;
        if tag != b'F' {
            return Err(self.error_reply(tag, "render"));
        }
        let mut size = [0u8; 8];
        self.read_exact_or_fail(&mut size, "render")?;
        let height = u32::from_le_bytes(size[0..4].try_into().expect("4 bytes")) as usize;
        let width = u32::from_le_bytes(size[4..8].try_into().expect("4 bytes")) as usize;
        let mut rgb = vec![0; width * height * 3];
        self.read_exact_or_fail(&mut rgb, "render")?;
        Ok(Frame { width, height, rgb })
    }
}

impl Env for GymProcess {
    fn id(&self) -> &str {
        &self.id
    }

    fn observation_space(&self) -> ObservationSpace {
        ObservationSpace::floats(self.shape.clone(), self.low, self.high)
    }

    fn action_space(&self) -> ActionSpace {
        ActionSpace { n: self.n_actions }
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        let mut message = [0u8; 9];
        message[0] = b'R';
        // Gymnasium seeds must be non-negative; -1 means "no seed".
        let seed = seed.map_or(-1, |s| (s & (i64::MAX as u64)) as i64);
        message[1..].copy_from_slice(&seed.to_le_bytes());
        self.request(&message, "reset", obs).map(|_| ())
    }

    fn step(&mut self, action: usize, obs: &mut [f32]) -> Result<Step, EnvError> {
        self.action_space().check(action)?;
        let mut message = [0u8; 5];
        message[0] = b'S';
        message[1..].copy_from_slice(&(action as u32).to_le_bytes());
        self.request(&message, "step", obs)
    }

    /// Gymnasium's `env.render()`, which needs the environment made with
    /// `render_mode=rgb_array` (the worker sets it for ALE's Atari games).
    fn render(&mut self) -> Result<Frame, EnvError> {
        self.request_frame()
    }
}

impl Drop for GymProcess {
    fn drop(&mut self) {
        if self.dead.is_none()
            && self.stdin.write_all(b"Q").is_ok()
            && self.wait_for_exit(100).is_some()
        {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
