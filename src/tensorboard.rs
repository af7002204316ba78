//! TensorBoard event files for a run: scalars with CleanRL's tags, and text summaries
//! (the resolved config). One writer per run directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use protobuf::RepeatedField;
use tensorboard_proto::summary::{
    Summary, SummaryMetadata, SummaryMetadata_PluginData, Summary_Value,
};
use tensorboard_proto::tensor::TensorProto;
use tensorboard_proto::types::DataType;
use tensorboard_rs::summary_writer::FileWriter;

pub struct TensorBoard {
    writer: Option<FileWriter>,
    dir: PathBuf,
}

impl TensorBoard {
    /// Opens a writer in `dir` after checking that it can be written (the crate
    /// panics on I/O errors, so they are caught here first).
    pub fn new(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let probe = dir.join(".write-test");
        std::fs::write(&probe, b"")
            .with_context(|| format!("cannot write to {}", dir.display()))?;
        let _ = std::fs::remove_file(probe);
        wait_for_unique_event_file_name(dir);
        Ok(Self {
            writer: Some(FileWriter::new(dir)),
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn add(&mut self, summary: Summary, step: u64) {
        if let Some(w) = &mut self.writer {
            w.add_summary(summary, step as usize);
        }
    }

    pub fn scalar(&mut self, tag: &str, value: f64, step: u64) {
        let mut v = Summary_Value::new();
        v.set_tag(tag.to_string());
        v.set_simple_value(value as f32);
        let mut summary = Summary::new();
        summary.set_value(RepeatedField::from_vec(vec![v]));
        self.add(summary, step);
    }

    /// A text summary (rendered as Markdown by TensorBoard's text plugin).
    pub fn text(&mut self, tag: &str, text: &str, step: u64) {
        let mut tensor = TensorProto::new();
        tensor.set_dtype(DataType::DT_STRING);
        tensor.set_string_val(RepeatedField::from_vec(vec![text.as_bytes().to_vec()]));
        let mut plugin = SummaryMetadata_PluginData::new();
        plugin.set_plugin_name("text".to_string());
        let mut meta = SummaryMetadata::new();
        meta.set_plugin_data(plugin);
        let mut v = Summary_Value::new();
        v.set_tag(tag.to_string());
        v.set_metadata(meta);
        v.set_tensor(tensor);
        let mut summary = Summary::new();
        summary.set_value(RepeatedField::from_vec(vec![v]));
        self.add(summary, step);
    }

    pub fn flush(&mut self) {
        if let Some(w) = &mut self.writer {
            w.flush();
        }
    }
}

/// tensorboard-rs names files by the second and the process id: a second writer in
/// the same directory within the same second would truncate the first. Wait for the
/// next second in that case.
fn wait_for_unique_event_file_name(dir: &Path) {
    loop {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let prefix = format!("events.out.tfevents.{secs:010}.");
        let pid = format!(".{}.0", std::process::id());
        let clash = std::fs::read_dir(dir)
            .map(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(&prefix) && name.ends_with(&pid)
                })
            })
            .unwrap_or(false);
        if !clash {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

impl Drop for TensorBoard {
    fn drop(&mut self) {
        // Dropping the writer joins its background thread, so everything is on disk.
        if let Some(mut w) = self.writer.take() {
            w.flush();
        }
    }
}
