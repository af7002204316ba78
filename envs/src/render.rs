//! Pictures of an environment's state, for watching an agent play: [`Env::render`]
//! returns a [`Frame`], an RGB image at the environment's own scale (a MinAtar cell is
//! one pixel, CartPole is Gymnasium's 600 x 400 screen); whoever shows it scales it.
//!
//! [`Env::render`]: crate::Env::render

/// An RGB image: `height` rows of `width` pixels, top row first, 3 bytes a pixel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub width: usize,
    pub height: usize,
    pub rgb: Vec<u8>,
}

pub type Rgb = [u8; 3];

impl Frame {
    /// A frame of one colour.
    pub fn filled(width: usize, height: usize, color: Rgb) -> Self {
        Self {
            width,
            height,
            rgb: color.repeat(width * height),
        }
    }

    /// The pixel at column `x`, row `y`.
    pub fn pixel(&self, x: usize, y: usize) -> Rgb {
        let i = 3 * (y * self.width + x);
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    pub fn set(&mut self, x: usize, y: usize, color: Rgb) {
        let i = 3 * (y * self.width + x);
        self.rgb[i..i + 3].copy_from_slice(&color);
    }

    /// Colours the pixels whose centres `inside` accepts, among columns `x0..x1` and
    /// rows `y0..y1` (clipped to the frame).
    pub fn paint(
        &mut self,
        (x0, x1): (i64, i64),
        (y0, y1): (i64, i64),
        color: Rgb,
        inside: impl Fn(f64, f64) -> bool,
    ) {
        let clip = |v: i64, n: usize| v.clamp(0, n as i64) as usize;
        for y in clip(y0, self.height)..clip(y1, self.height) {
            for x in clip(x0, self.width)..clip(x1, self.width) {
                if inside(x as f64 + 0.5, y as f64 + 0.5) {
                    self.set(x, y, color);
                }
            }
        }
    }

    /// Each pixel as a `factor` x `factor` square (MinAtar's cells drawn large).
    pub fn scaled_up(&self, factor: usize) -> Frame {
        let factor = factor.max(1);
        let width = self.width * factor;
        let mut rgb = Vec::with_capacity(self.rgb.len() * factor * factor);
        for row in self.rgb.chunks_exact(3 * self.width.max(1)) {
            let wide: Vec<u8> = row.chunks_exact(3).flat_map(|p| p.repeat(factor)).collect();
            for _ in 0..factor {
                rgb.extend_from_slice(&wide);
            }
        }
        Frame {
            width,
            height: self.height * factor,
            rgb,
        }
    }

    /// Every `stride`-th pixel of every `stride`-th row (a large frame made small
    /// without new colours, so that its palette stays exact).
    pub fn subsampled(&self, stride: usize) -> Frame {
        let stride = stride.max(1);
        let (width, height) = (self.width.div_ceil(stride), self.height.div_ceil(stride));
        let mut rgb = Vec::with_capacity(width * height * 3);
        for y in (0..self.height).step_by(stride) {
            for x in (0..self.width).step_by(stride) {
                rgb.extend_from_slice(&self.pixel(x, y));
            }
        }
        Frame { width, height, rgb }
    }

    /// Scaled by a whole factor, up or down, so that its longer side comes as close to
    /// `side` pixels as whole factors allow (never above it when shrinking).
    pub fn fit(&self, side: usize) -> Frame {
        let longest = self.width.max(self.height).max(1);
        if longest <= side {
            self.scaled_up(side / longest)
        } else {
            self.subsampled(longest.div_ceil(side.max(1)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_keeps_colours_and_fits_the_side() {
        let mut f = Frame::filled(2, 1, [0, 0, 0]);
        f.set(1, 0, [9, 8, 7]);
        let up = f.scaled_up(3);
        assert_eq!((up.width, up.height), (6, 3));
        assert_eq!(up.pixel(2, 2), [0, 0, 0]);
        assert_eq!(up.pixel(3, 0), [9, 8, 7]);
        assert_eq!(up.subsampled(3), f);
        let big = Frame::filled(600, 400, [1, 2, 3]);
        let small = big.fit(160);
        assert_eq!((small.width, small.height), (150, 100));
        assert_eq!(f.fit(10).width, 10);
    }

    #[test]
    fn paint_clips_to_the_frame() {
        let mut f = Frame::filled(4, 4, [0, 0, 0]);
        f.paint((-5, 2), (-5, 9), [1, 1, 1], |x, _| x < 1.0);
        let lit: Vec<_> = (0..4).map(|y| f.pixel(0, y)).collect();
        assert_eq!(lit, vec![[1, 1, 1]; 4]);
        assert_eq!(f.pixel(1, 0), [0, 0, 0]);
    }
}
