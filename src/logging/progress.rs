//! A progress bar on a terminal (nothing when output is redirected).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress(Option<ProgressBar>);

impl Progress {
    pub fn new(enabled: bool, total: u64, position: u64) -> Self {
        if !enabled || !std::io::stderr().is_terminal() {
            return Self(None);
        }
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:40} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta}]",
            )
            .expect("valid template"),
        );
        bar.set_position(position);
        Self(Some(bar))
    }

    pub fn update(&self, step: u64, sps: f64, recent_return: Option<f64>) {
        if let Some(bar) = &self.0 {
            bar.set_position(step);
            let ret = recent_return
                .map(|r| format!("{r:.1}"))
                .unwrap_or_else(|| "-".into());
            bar.set_message(format!("{sps:.0} steps/s  return {ret}"));
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}
