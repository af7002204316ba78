//! Animated GIFs of evaluation episodes, from the environment's own
//! [`render`](normrl_envs::Env::render): `normrl eval --video out.gif`, and with
//! `eval.video = true` TensorBoard's `eval/episode` image.
//!
//! The `gif` crate encodes (LZW, the file's blocks); two small pieces are ours. Each
//! frame's palette is its exact colours when it has at most 256 (every native game
//! has a dozen at most): the crate's only RGB path quantizes with NeuQuant, which
//! changes colours even when none need to go. And each frame after the first holds only
//! the rectangle that changed since the one before (the GIF format's own way to
//! animate; the crate leaves it to its caller): a MinAtar frame then costs tens of
//! bytes instead of hundreds.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use normrl_envs::{Env, Frame};

/// Hundredths of a second a frame stays on screen (about 16 frames a second).
pub const FRAME_DELAY: u16 = 6;

/// Encodes frames of one size, one at a time, into a looping GIF held in memory.
pub struct GifEncoder {
    encoder: gif::Encoder<Vec<u8>>,
    previous: Option<Frame>,
    width: usize,
    height: usize,
    frames: usize,
}

impl GifEncoder {
    pub fn new(width: usize, height: usize) -> Result<Self> {
        let side = |v: usize| u16::try_from(v).ok().filter(|&v| v > 0);
        let (Some(w), Some(h)) = (side(width), side(height)) else {
            bail!("a GIF frame must be 1 to 65535 pixels a side, not {width} x {height}");
        };
        let mut encoder = gif::Encoder::new(Vec::new(), w, h, &[])?;
        encoder.set_repeat(gif::Repeat::Infinite)?;
        Ok(Self {
            encoder,
            previous: None,
            width,
            height,
            frames: 0,
        })
    }

    /// Frames written so far.
    pub fn frames(&self) -> usize {
        self.frames
    }

    pub fn push(&mut self, frame: Frame) -> Result<()> {
        if (frame.width, frame.height) != (self.width, self.height) {
            bail!(
                "a video's frames must keep one size: {} x {} after {} x {}",
                frame.width,
                frame.height,
                self.width,
                self.height
            );
        }
        // An unchanged frame still needs a frame (one frame a step): one pixel of it.
        let (x0, y0, x1, y1) = match &self.previous {
            None => (0, 0, self.width, self.height),
            Some(before) => changed_rect(before, &frame).unwrap_or((0, 0, 1, 1)),
        };
        let mut out = indexed(&frame, (x0, y0, x1, y1));
        out.delay = FRAME_DELAY;
        self.encoder.write_frame(&out)?;
        self.previous = Some(frame);
        self.frames += 1;
        Ok(())
    }

    /// The GIF file's bytes.
    pub fn finish(self) -> Result<Vec<u8>> {
        Ok(self.encoder.into_inner()?)
    }
}

/// The smallest rectangle `(x0, y0, x1, y1)` (ends excluded) holding every pixel that
/// differs between two frames of one size; `None` when none does.
fn changed_rect(a: &Frame, b: &Frame) -> Option<(usize, usize, usize, usize)> {
    let row_len = 3 * a.width;
    let rows =
        |y: &usize| a.rgb[y * row_len..(y + 1) * row_len] != b.rgb[y * row_len..(y + 1) * row_len];
    let y0 = (0..a.height).find(rows)?;
    let y1 = (0..a.height).rev().find(rows)? + 1;
    let column = |x: &usize| (y0..y1).any(|y| a.pixel(*x, y) != b.pixel(*x, y));
    let x0 = (0..a.width).find(column)?;
    let x1 = (0..a.width).rev().find(column)? + 1;
    Some((x0, y0, x1, y1))
}

/// The rectangle of `frame` as a GIF frame: indices into its exact colours when there
/// are at most 256, else the crate's NeuQuant quantization.
fn indexed(frame: &Frame, (x0, y0, x1, y1): (usize, usize, usize, usize)) -> gif::Frame<'static> {
    let (w, h) = (x1 - x0, y1 - y0);
    let mut rgb = Vec::with_capacity(3 * w * h);
    for y in y0..y1 {
        rgb.extend_from_slice(&frame.rgb[3 * (y * frame.width + x0)..3 * (y * frame.width + x1)]);
    }
    let mut palette: HashMap<[u8; 3], u8> = HashMap::new();
    let mut order: Vec<u8> = vec![];
    let mut pixels = Vec::with_capacity(w * h);
    for p in rgb.chunks_exact(3) {
        let color = [p[0], p[1], p[2]];
        let next = palette.len();
        let index = match palette.get(&color) {
            Some(&i) => i,
            None if next < 256 => {
                palette.insert(color, next as u8);
                order.extend_from_slice(&color);
                next as u8
            }
            None => {
                let mut out = gif::Frame::from_rgb_speed(w as u16, h as u16, &rgb, 10);
                (out.left, out.top) = (x0 as u16, y0 as u16);
                return out;
            }
        };
        pixels.push(index);
    }
    let mut out = gif::Frame::from_palette_pixels(w as u16, h as u16, pixels, order, None);
    (out.left, out.top) = (x0 as u16, y0 as u16);
    out
}

/// What a video shows of an evaluation, and how large.
#[derive(Debug, Clone, Copy)]
pub struct VideoOptions {
    /// The frame's longer side in pixels, as near as whole scale factors come.
    pub side: usize,
    /// Episodes recorded (the first ones); `None`: all.
    pub episodes: Option<u64>,
    /// Frames at most; later steps are not recorded.
    pub max_frames: Option<usize>,
    /// A line under the picture with the episode, step and return so far.
    pub caption: bool,
}

/// Where a frame is in an evaluation, for its caption.
#[derive(Debug, Clone, Copy)]
pub struct FrameInfo {
    /// 0-based.
    pub episode: u64,
    pub step: u64,
    pub return_so_far: f64,
}

/// `normrl eval --video`: every episode, a MinAtar cell 30 pixels, CartPole at half
/// Gymnasium's size, with captions.
pub const EVAL_VIDEO: VideoOptions = VideoOptions {
    side: 300,
    episodes: None,
    max_frames: None,
    caption: true,
};

/// `eval.video = true`: an evaluation's first episode in TensorBoard, kept small (a
/// MinAtar cell 8 pixels, CartPole 75 x 50, 300 frames at most) because every
/// evaluation adds one to the run's event file.
pub const TENSORBOARD_VIDEO: VideoOptions = VideoOptions {
    side: 80,
    episodes: Some(1),
    max_frames: Some(300),
    caption: false,
};

/// The frames of an evaluation's episodes, one after the other in one GIF: the first
/// observation's picture, then one a step.
pub struct Video {
    options: VideoOptions,
    encoder: Option<GifEncoder>,
}

impl Video {
    pub fn new(options: VideoOptions) -> Self {
        Self {
            options,
            encoder: None,
        }
    }

    /// Whether episode `episode` (0-based) is recorded.
    pub fn records(&self, episode: u64) -> bool {
        let full = self
            .options
            .max_frames
            .zip(self.encoder.as_ref())
            .is_some_and(|(max, e)| e.frames() >= max);
        !full && self.options.episodes.is_none_or(|n| episode < n)
    }

    /// Adds the environment's current picture, scaled to the video's size.
    pub fn frame(&mut self, env: &mut dyn Env, at: FrameInfo) -> Result<()> {
        let mut frame = env.render()?.fit(self.options.side);
        if self.options.caption {
            let text = format!(
                "episode {}   step {}   return {}",
                at.episode + 1,
                at.step,
                at.return_so_far
            );
            frame = captioned(frame, &text)?;
        }
        let encoder = match &mut self.encoder {
            Some(e) => e,
            None => self
                .encoder
                .insert(GifEncoder::new(frame.width, frame.height)?),
        };
        encoder.push(frame)
    }

    /// Frames recorded.
    pub fn frames(&self) -> usize {
        self.encoder.as_ref().map_or(0, GifEncoder::frames)
    }

    /// The GIF: its bytes, width and height; `None` when nothing was recorded.
    pub fn finish(self) -> Result<Option<(Vec<u8>, usize, usize)>> {
        let Some(encoder) = self.encoder else {
            return Ok(None);
        };
        let (w, h) = (encoder.width, encoder.height);
        let bytes = encoder.finish().context("encoding the video")?;
        Ok(Some((bytes, w, h)))
    }
}

/// `frame` with a black strip under it holding `text` in white.
fn captioned(frame: Frame, text: &str) -> Result<Frame> {
    use plotters::prelude::*;
    crate::logging::font::register_font();
    let strip = (frame.width / 14).clamp(12, 24);
    let mut rgb = vec![0u8; 3 * frame.width * strip];
    {
        let size = (frame.width as u32, strip as u32);
        let area = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
        let font = ("sans-serif", strip as f64 * 0.75)
            .into_font()
            .color(&WHITE);
        let drawn = area
            .draw(&Text::new(text, (3, strip as i32 / 8), font))
            .and_then(|_| area.present());
        drawn.map_err(|e| anyhow::anyhow!("drawing a video's caption: {e:?}"))?;
    }
    let mut out = frame;
    out.height += strip;
    out.rgb.extend_from_slice(&rgb);
    Ok(out)
}

/// Fails, naming the environment, when it cannot draw itself: checked before an
/// evaluation so that a video that cannot be made costs no episodes.
pub fn check_renders(env: &mut dyn Env) -> Result<()> {
    let mut obs = vec![0.0; env.observation_space().len()];
    env.reset(Some(0), &mut obs)?;
    env.render()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> Vec<(u16, u16, u16, u16)> {
        let mut options = gif::DecodeOptions::new();
        options.set_color_output(gif::ColorOutput::RGBA);
        let mut decoder = options.read_info(bytes).unwrap();
        let mut rects = vec![];
        while let Some(f) = decoder.read_next_frame().unwrap() {
            rects.push((f.left, f.top, f.width, f.height));
        }
        rects
    }

    #[test]
    fn later_frames_hold_only_what_changed() {
        let mut a = Frame::filled(8, 6, [0, 0, 0]);
        let mut gif = GifEncoder::new(8, 6).unwrap();
        gif.push(a.clone()).unwrap();
        a.set(2, 3, [5, 5, 5]);
        a.set(4, 1, [6, 6, 6]);
        gif.push(a.clone()).unwrap();
        gif.push(a).unwrap();
        let rects = decode(&gif.finish().unwrap());
        assert_eq!(rects, [(0, 0, 8, 6), (2, 1, 3, 3), (0, 0, 1, 1)]);
    }

    #[test]
    fn many_colours_fall_back_to_quantization() {
        let mut f = Frame::filled(30, 30, [0, 0, 0]);
        for i in 0..900 {
            f.set(i % 30, i / 30, [(i % 256) as u8, (i / 256) as u8 * 60, 7]);
        }
        let mut gif = GifEncoder::new(30, 30).unwrap();
        gif.push(f).unwrap();
        assert_eq!(decode(&gif.finish().unwrap()).len(), 1);
        assert!(GifEncoder::new(0, 3).is_err());
    }
}
