//! The one font all drawn text uses (report figures, video captions): DejaVu Sans,
//! built into the binary, so figures look the same on every machine.

use std::sync::Once;

use plotters::style::FontStyle;

static FONT: Once = Once::new();

/// Makes DejaVu Sans plotters' "sans-serif" (once; all text drawn needs it).
pub(crate) fn register_font() {
    FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
        // Registering only fails on a corrupt font, which include_bytes rules out.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes);
    });
}
