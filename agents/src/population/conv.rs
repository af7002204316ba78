//! A population's convolution as one product: each agent's samples are unfolded into
//! patches by one gather (im2col), multiplied by its `[C*k*k, out]` weights in one
//! batched product, and laid out channel-major as a single network's feature maps.

use candle_core::{Device, Result, Tensor};

/// The unfolding of one convolution (no padding).
#[derive(Clone)]
pub(crate) struct Im2col {
    /// For each output position and kernel offset, the input position it reads.
    index: Tensor,
    c_in: usize,
    in_positions: usize,
    kernel_area: usize,
    out_positions: usize,
}

impl Im2col {
    /// For inputs `[c_in, h, w]` and a square `k` kernel with `stride`.
    pub fn new(
        c_in: usize,
        (h, w): (usize, usize),
        k: usize,
        stride: usize,
        device: &Device,
    ) -> Result<Self> {
        let (ho, wo) = ((h - k) / stride + 1, (w - k) / stride + 1);
        let mut index = Vec::with_capacity(ho * wo * k * k);
        for oy in 0..ho {
            for ox in 0..wo {
                for ky in 0..k {
                    for kx in 0..k {
                        index.push(((oy * stride + ky) * w + ox * stride + kx) as u32);
                    }
                }
            }
        }
        let len = index.len();
        Ok(Self {
            index: Tensor::from_vec(index, len, device)?,
            c_in,
            in_positions: h * w,
            kernel_area: k * k,
            out_positions: ho * wo,
        })
    }

    /// Patches `[P, B * positions, c_in * k * k]` of inputs `[P, B, c_in * h * w]`,
    /// each patch's values channel by channel, then row by row of the kernel (a
    /// single network's weight layout).
    pub fn patches(&self, x: &Tensor) -> Result<Tensor> {
        let (p, b) = (x.dim(0)?, x.dim(1)?);
        let x = x.reshape((p * b, self.c_in, self.in_positions))?;
        x.index_select(&self.index, 2)?
            .reshape((p * b, self.c_in, self.out_positions, self.kernel_area))?
            .permute((0, 2, 1, 3))?
            .reshape((p, b * self.out_positions, self.c_in * self.kernel_area))
    }

    /// A product `[P, B * positions, out]` as feature maps `[P, B, out, positions]`.
    pub fn channels_first(&self, h: &Tensor, batch: usize) -> Result<Tensor> {
        let (p, out) = (h.dim(0)?, h.dim(2)?);
        h.reshape((p, batch, self.out_positions, out))?
            .transpose(2, 3)?
            .contiguous()
    }
}
