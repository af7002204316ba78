//! Observation and action spaces, Gymnasium-shaped.

/// The shape and bounds of an observation, always delivered as `f32` values in row-major
/// order (channels first for image-like observations: `[C, H, W]`).
#[derive(Debug, Clone, PartialEq)]
pub struct ObservationSpace {
    pub shape: Vec<usize>,
    /// Lower bound of every element (may be `f32::NEG_INFINITY`).
    pub low: f32,
    /// Upper bound of every element (may be `f32::INFINITY`).
    pub high: f32,
    /// True when every element is 0.0 or 1.0 (MinAtar's boolean grids): such
    /// observations can be stored bit-packed.
    pub binary: bool,
    /// True when every element is `k / 255` for an integer `k` in 0..=255 (8-bit
    /// images scaled to [0, 1]): such observations can be stored as bytes.
    pub bytes: bool,
}

impl ObservationSpace {
    /// Float observations of `shape`, every element within `[low, high]`.
    pub fn floats(shape: Vec<usize>, low: f32, high: f32) -> Self {
        Self {
            shape,
            low,
            high,
            binary: false,
            bytes: false,
        }
    }

    /// Number of `f32` elements in one observation.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A discrete action space with actions `0..n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionSpace {
    pub n: usize,
}

impl ActionSpace {
    /// Checks an action index, with an error that says what is allowed.
    pub fn check(&self, action: usize) -> Result<(), crate::EnvError> {
        if action < self.n {
            Ok(())
        } else {
            Err(crate::EnvError::InvalidAction { action, n: self.n })
        }
    }
}
