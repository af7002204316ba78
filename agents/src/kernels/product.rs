//! The products behind the fused Linear and data-convolution ops, on host slices, so
//! that plain layers and weight-normalized ones (which scale each unit's output) share
//! one implementation of each product and its gradients.

use candle_core::Shape;

pub(crate) trait Product {
    /// The output's shape, units on dim 1.
    fn out_shape(&self) -> Shape;

    /// `input (*) w`.
    fn forward(&self, input: &[f32], w: &[f32]) -> Vec<f32>;

    /// The weight gradient, and the input's when asked, from the output gradient `dy`.
    fn backward(
        &self,
        input: &[f32],
        w: &[f32],
        dy: &[f32],
        input_gradient: bool,
    ) -> (Vec<f32>, Option<Vec<f32>>);
}
