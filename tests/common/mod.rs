//! Shared by the integration tests: running the `normrl` binary, and for those that
//! talk to Python (TensorBoard's reader, the Gymnasium bridge) a virtual environment
//! under `target/` with `tests/python-requirements.txt`, made on first use and reused
//! afterwards.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Runs the `normrl` binary: its exit status, standard output and standard error.
pub fn normrl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_normrl"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A comparison of CartPole runs written to `dir/<name>.toml` (its `base` is
/// `configs/cartpole.toml`); `body` holds the rest: seeds, `[set]`, `[axes]` and any
/// other table.
pub fn cartpole_comparison(dir: &Path, name: &str, body: &str) -> PathBuf {
    let base = std::fs::canonicalize("configs/cartpole.toml").unwrap();
    let path = dir.join(format!("{name}.toml"));
    let text = format!("name = \"{name}\"\nbase = \"{}\"\n{body}", base.display());
    std::fs::write(&path, text).unwrap();
    path
}

/// Each line of `out` as JSON (what `--json` prints).
pub fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// An empty folder `normrl-<name>-<pid>` in the temp dir: what an earlier run of this
/// name left there is removed.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("normrl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The training config at `path` with the `key=value` `overrides` applied.
pub fn train_config(path: &str, overrides: &[&str]) -> normrl::config::TrainConfig {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    normrl::config::TrainConfig::load(Path::new(path), &overrides).unwrap()
}

/// The `--set`s that name a method: a preset's name (`norm.kind`), or a pair of parts
/// written `weight+activation` (`norm.weight`, `norm.activation`).
pub fn method_sets(method: &str) -> Vec<String> {
    match method.split_once('+') {
        Some((w, a)) => vec![format!("norm.weight={w}"), format!("norm.activation={a}")],
        None => vec![format!("norm.kind={method}")],
    }
}

/// The number in `text` right after the first `marker`, up to the next `end`; panics
/// naming `text` where there is none.
pub fn number_after<T: std::str::FromStr>(text: &str, marker: &str, end: char) -> T {
    let rest = text.split(marker).nth(1);
    rest.and_then(|rest| rest.split(end).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {marker:?} in: {text}"))
}

/// `[set]` lines of a short CartPole comparison's runs: learning from step 200, two
/// evaluation episodes every 500 steps, no checkpoints.
pub const SHORT_RUNS: &str = r#""replay.learning_starts" = 200
"eval.interval" = 500
"eval.episodes" = 2
"checkpoint.interval" = 0
"#;

/// The venv's interpreter. Panics with the reason when Python or pip cannot set it up.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let requirements =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python-requirements.txt");
        let wanted = std::fs::read_to_string(&requirements).expect("tests/python-requirements.txt");
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("py-venv");
        let python = venv.join("bin/python");
        let stamp = venv.join("normrl-requirements.txt");
        if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str())
            && python.exists()
        {
            return python;
        }
        let status = Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv)
            .status()
            .expect("python3 is needed for the Python-backed tests");
        assert!(status.success(), "python3 -m venv failed");
        let status = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&requirements)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "pip install -r {} failed",
            requirements.display()
        );
        std::fs::write(&stamp, wanted).unwrap();
        python
    })
}

/// The online network's values in a run's latest checkpoint, by name.
pub fn checkpoint_weights(run: &Path) -> Vec<(String, Vec<f32>)> {
    let dir = normrl::checkpoint::latest(run).unwrap().unwrap();
    let map = normrl::checkpoint::load_tensors(&dir, "online", &candle_core::Device::Cpu).unwrap();
    let mut v: Vec<_> = map
        .into_iter()
        .map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// A process this test started: killed by its id if the test fails before it ends.
pub struct Started(pub Option<std::process::Child>);

impl Started {
    pub fn id(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// Waits for the process to end; its status and output.
    pub fn wait(mut self) -> std::process::Output {
        let child = self.0.take().expect("running");
        child.wait_with_output().unwrap()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A decoded GIF frame: its rectangle on the canvas and its RGB pixels.
pub struct GifFrame {
    pub left: usize,
    pub top: usize,
    pub width: usize,
    pub height: usize,
    pub rgb: Vec<u8>,
}

/// Every frame of a GIF, decoded by the `gif` crate.
pub fn decode_gif(bytes: &[u8]) -> Vec<GifFrame> {
    let mut options = gif::DecodeOptions::new();
    options.set_color_output(gif::ColorOutput::RGBA);
    let mut decoder = options.read_info(bytes).unwrap();
    let mut frames = vec![];
    while let Some(f) = decoder.read_next_frame().unwrap() {
        frames.push(GifFrame {
            left: f.left.into(),
            top: f.top.into(),
            width: f.width.into(),
            height: f.height.into(),
            rgb: f
                .buffer
                .chunks_exact(4)
                .flat_map(|p| [p[0], p[1], p[2]])
                .collect(),
        });
    }
    frames
}
