//! Range checks shared by the config validators (NaN fails every one).

pub(crate) fn positive(x: f64) -> bool {
    x > 0.0 && x.is_finite()
}

pub(crate) fn non_negative(x: f64) -> bool {
    x >= 0.0 && x.is_finite()
}
