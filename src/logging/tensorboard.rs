//! TensorBoard event files for a run: scalars with CleanRL's tags, text summaries (the
//! resolved config), images (an evaluation episode's GIF), and a restart marker when a
//! run resumes. One writer per run directory.
//!
//! The file is a TFRecord stream of `Event` protobufs: each record is its length (u64
//! LE), the masked CRC-32C of the length, the bytes, and their masked CRC-32C. Records
//! are written synchronously through a buffer (flushed at least every 10 s while events
//! come, and by `flush`), so a write error reaches the caller instead of a background
//! thread.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use protobuf::{Message, RepeatedField};
use tensorboard_proto::event::{Event, SessionLog, SessionLog_SessionStatus};
use tensorboard_proto::summary::{
    Summary, SummaryMetadata, SummaryMetadata_PluginData, Summary_Image, Summary_Value,
};
use tensorboard_proto::tensor::TensorProto;
use tensorboard_proto::tensor_shape::{TensorShapeProto, TensorShapeProto_Dim};
use tensorboard_proto::types::DataType;

const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// TFRecord's checksum: CRC-32C, rotated and offset so that CRCs of CRCs stay useful.
fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = CRC32C.checksum(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Drops from every event file in `dir` the events logged after `step`, and a record
/// cut off mid-write: what a killed run logged after its last checkpoint, which the
/// resumed run logs again. Each file is rewritten atomically, so every reader (not only
/// those that purge orphaned events after a restart marker) sees each step once.
pub fn truncate_after(dir: &Path, step: u64) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        let is_events = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("events.out.tfevents"));
        if !is_events || path.extension().is_some_and(|e| e == "tmp") {
            continue;
        }
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let kept = records_up_to(&bytes, step);
        if kept.len() < bytes.len() {
            crate::storage::write_atomic(&path, &kept)?;
        }
    }
    Ok(())
}

/// The whole records of a TFRecord stream whose event's step is at most `step`.
fn records_up_to(bytes: &[u8], step: u64) -> Vec<u8> {
    let mut kept = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at + 12 <= bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let Some(end) = usize::try_from(len)
            .ok()
            .and_then(|len| (at + 12).checked_add(len))
            .and_then(|e| e.checked_add(4))
            .filter(|&e| e <= bytes.len())
        else {
            break;
        };
        let data = &bytes[at + 12..end - 4];
        let crc_ok = masked_crc32c(data).to_le_bytes() == bytes[end - 4..end];
        let event = Event::parse_from_bytes(data).ok().filter(|_| crc_ok);
        match event {
            Some(e) if e.get_step() <= step as i64 => kept.extend_from_slice(&bytes[at..end]),
            Some(_) => {}
            None => break,
        }
        at = end;
    }
    kept
}

pub struct TensorBoard {
    writer: BufWriter<File>,
    dir: PathBuf,
    /// The event file, which a write error names.
    path: PathBuf,
    /// The first write error; later writes are skipped and `flush` reports it.
    error: Option<std::io::Error>,
    /// When the buffer last went to disk: a live TensorBoard sees events at most
    /// [`FLUSH_EVERY`] late.
    flushed: std::time::Instant,
}

const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl TensorBoard {
    /// Opens a new event file in `dir` (named like TensorFlow's, with a sequence number
    /// so two writers in the same second never share a file).
    pub fn new(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let host = hostname();
        let pid = std::process::id();
        let (path, file) = (0u32..)
            .find_map(|n| {
                let path = dir.join(format!("events.out.tfevents.{secs:010}.{host}.{pid}.{n}"));
                match File::options().write(true).create_new(true).open(&path) {
                    Ok(file) => Some(Ok((path, file))),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .expect("an unbounded range always finds a name")
            .with_context(|| format!("cannot write an event file in {}", dir.display()))?;
        let mut tb = Self {
            writer: BufWriter::new(file),
            dir: dir.to_path_buf(),
            path: path.clone(),
            error: None,
            flushed: std::time::Instant::now(),
        };
        let mut event = Event::new();
        event.set_file_version("brain.Event:2".to_string());
        tb.write(event, 0);
        tb.flush()
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(tb)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write(&mut self, mut event: Event, step: u64) {
        if self.error.is_some() {
            return;
        }
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        event.set_wall_time(wall);
        event.set_step(step as i64);
        let data = match event.write_to_bytes() {
            Ok(data) => data,
            Err(e) => {
                self.error = Some(std::io::Error::other(e));
                return;
            }
        };
        let len = (data.len() as u64).to_le_bytes();
        let result = self
            .writer
            .write_all(&len)
            .and_then(|_| self.writer.write_all(&masked_crc32c(&len).to_le_bytes()))
            .and_then(|_| self.writer.write_all(&data))
            .and_then(|_| self.writer.write_all(&masked_crc32c(&data).to_le_bytes()));
        if let Err(e) = result {
            self.error = Some(e);
        } else if self.flushed.elapsed() > FLUSH_EVERY {
            self.flushed = std::time::Instant::now();
            if let Err(e) = self.writer.flush() {
                self.error = Some(e);
            }
        }
    }

    fn add(&mut self, value: Summary_Value, step: u64) {
        let mut summary = Summary::new();
        summary.set_value(RepeatedField::from_vec(vec![value]));
        let mut event = Event::new();
        event.set_summary(summary);
        self.write(event, step);
    }

    pub fn scalar(&mut self, tag: &str, value: f64, step: u64) {
        let mut v = Summary_Value::new();
        v.set_tag(tag.to_string());
        v.set_simple_value(value as f32);
        self.add(v, step);
    }

    /// An image summary holding an encoded image (PNG, or a GIF that TensorBoard's
    /// images tab plays, as tensorboardX's `add_video` writes it), RGB.
    pub fn image(&mut self, tag: &str, encoded: &[u8], width: usize, height: usize, step: u64) {
        let mut image = Summary_Image::new();
        image.set_width(width as i32);
        image.set_height(height as i32);
        image.set_colorspace(3);
        image.set_encoded_image_string(encoded.to_vec());
        let mut v = Summary_Value::new();
        v.set_tag(tag.to_string());
        v.set_image(image);
        self.add(v, step);
    }

    /// A summary for `plugin` (its `content` is the plugin's own protobuf), with the
    /// empty tensor TensorFlow writes for such summaries: the hparams dashboard reads
    /// its data this way.
    pub fn plugin_summary(&mut self, tag: &str, plugin: &str, content: Vec<u8>, step: u64) {
        let mut dim = TensorShapeProto_Dim::new();
        dim.set_size(0);
        let mut shape = TensorShapeProto::new();
        shape.set_dim(RepeatedField::from_vec(vec![dim]));
        let mut tensor = TensorProto::new();
        tensor.set_dtype(DataType::DT_FLOAT);
        tensor.set_tensor_shape(shape);
        self.plugin_value(tag, plugin, content, tensor, step);
    }

    /// A text summary (rendered as Markdown by TensorBoard's text plugin).
    pub fn text(&mut self, tag: &str, text: &str, step: u64) {
        let mut tensor = TensorProto::new();
        tensor.set_dtype(DataType::DT_STRING);
        tensor.set_string_val(RepeatedField::from_vec(vec![text.as_bytes().to_vec()]));
        self.plugin_value(tag, "text", vec![], tensor, step);
    }

    /// A tensor value tagged for `plugin`, with its plugin data.
    fn plugin_value(
        &mut self,
        tag: &str,
        plugin: &str,
        content: Vec<u8>,
        tensor: TensorProto,
        step: u64,
    ) {
        let mut data = SummaryMetadata_PluginData::new();
        data.set_plugin_name(plugin.to_string());
        data.set_content(content);
        let mut meta = SummaryMetadata::new();
        meta.set_plugin_data(data);
        let mut v = Summary_Value::new();
        v.set_tag(tag.to_string());
        v.set_metadata(meta);
        v.set_tensor(tensor);
        self.add(v, step);
    }

    /// Marks a restart at `step`: TensorBoard then drops the events at `step` and later
    /// that an interrupted run wrote after its last checkpoint, so a resumed run's
    /// curves have no duplicated stretch.
    pub fn restart(&mut self, step: u64) {
        let mut log = SessionLog::new();
        log.set_status(SessionLog_SessionStatus::START);
        let mut event = Event::new();
        event.set_session_log(log);
        self.write(event, step);
    }

    /// Writes everything buffered to the file; reports the first write error, if any.
    pub fn flush(&mut self) -> Result<()> {
        self.flushed = std::time::Instant::now();
        if self.error.is_none() {
            if let Err(e) = self.writer.flush() {
                self.error = Some(e);
            }
        }
        match &self.error {
            None => Ok(()),
            Some(e) => Err(anyhow::anyhow!(
                "cannot write TensorBoard events to {}: {e}",
                self.path.display()
            )),
        }
    }
}

/// The host's name as the event file's name carries it (TensorBoard's convention,
/// `events.out.tfevents.<time>.<host>`): the name `result.json` records
/// (`storage::host_name`), with only the characters a file name keeps.
fn hostname() -> String {
    let name = crate::storage::host_name();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        .collect();
    if name.is_empty() {
        "localhost".to_string()
    } else {
        name
    }
}

impl Drop for TensorBoard {
    fn drop(&mut self) {
        let _ = self.writer.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::masked_crc32c;

    #[test]
    fn masked_crc_matches_tensorboard() {
        // Values from TensorBoard's own `masked_crc32c` (tensorflow_stub), Python.
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
        assert_eq!(masked_crc32c(&0u64.to_le_bytes()), 0x0798_0329);
    }
}
