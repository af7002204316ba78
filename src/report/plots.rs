//! Charts for comparison reports, as PNG and SVG, drawn with plotters and an embedded
//! font (DejaVu Sans) so that no system font is needed.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// One line with a band: `(x, y, low, high)` points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64, f64, f64)>,
}

/// A line chart's title and axes. `x_steps`: the x axis counts environment steps,
/// labelled 50k / 1.5M rather than 50000.0.
pub struct Axes {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_steps: bool,
}

impl Axes {
    /// A chart over environment steps.
    pub fn over_steps(title: &str, y_label: &str) -> Self {
        Self {
            title: title.to_string(),
            x_label: "environment steps".into(),
            y_label: y_label.to_string(),
            x_steps: true,
        }
    }
}

/// A step count as people write it: 0, 500, 50k, 1.5M.
pub fn step_label(x: f64) -> String {
    let trim = |v: f64, unit: &str| {
        let text = format!("{v:.1}");
        format!("{}{unit}", text.trim_end_matches(".0"))
    };
    match x.abs() {
        a if a >= 1e6 => trim(x / 1e6, "M"),
        a if a >= 1e3 => trim(x / 1e3, "k"),
        _ => format!("{x:.0}"),
    }
}

/// One bar with an interval.
pub struct Bar {
    pub name: String,
    pub value: f64,
    pub low: f64,
    pub high: f64,
}

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
        // Registering only fails on a corrupt font, which include_bytes rules out.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes);
    });
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting failed: {e:?}")
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-6);
    (lo - pad, hi + pad)
}

fn draw_lines<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    axes: &Axes,
    series: &[Series],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let (x0, x1) = bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let (y0, y1) = bounds(
        series
            .iter()
            .flat_map(|s| s.points.iter().flat_map(|p| [p.2, p.3])),
    );
    let mut chart = ChartBuilder::on(root)
        .caption(&axes.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let plain = |x: &f64| format!("{x}");
    let steps = |x: &f64| step_label(*x);
    chart
        .configure_mesh()
        .x_desc(&axes.x_label)
        .y_desc(&axes.y_label)
        .x_label_formatter(if axes.x_steps { &steps } else { &plain })
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i);
        let mut band: Vec<(f64, f64)> = s.points.iter().map(|p| (p.0, p.3)).collect();
        band.extend(s.points.iter().rev().map(|p| (p.0, p.2)));
        chart
            .draw_series(std::iter::once(Polygon::new(band, color.mix(0.2))))
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                s.points.iter().map(|p| (p.0, p.1)),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    bars: &[Bar],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let (y0, y1) = bounds(bars.iter().flat_map(|b| [b.low, b.high, 0.0]));
    let n = bars.len() as f64;
    let names: Vec<String> = bars.iter().map(|b| b.name.clone()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(70)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n - 0.5, y0..y1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len().max(1))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    for (i, b) in bars.iter().enumerate() {
        let x = i as f64;
        let color = Palette99::pick(i);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x - 0.35, 0.0), (x + 0.35, b.value)],
                color.mix(0.7).filled(),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, b.low), (x, b.high)],
                BLACK.stroke_width(2),
            )))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// `<stem>.<ext>`, whatever dots the stem holds (`Path::with_extension` would replace
/// what follows the last one).
fn with_suffix(stem: &Path, ext: &str) -> std::path::PathBuf {
    let mut name = stem.as_os_str().to_owned();
    name.push(".");
    name.push(ext);
    name.into()
}

/// Writes `<stem>.png` and `<stem>.svg` with lines and bands.
pub fn line_chart(stem: &Path, axes: &Axes, series: &[Series]) -> Result<()> {
    register_font();
    let png = with_suffix(stem, "png");
    let svg = with_suffix(stem, "svg");
    draw_lines(
        &BitMapBackend::new(&png, (900, 560)).into_drawing_area(),
        axes,
        series,
    )?;
    draw_lines(
        &SVGBackend::new(&svg, (900, 560)).into_drawing_area(),
        axes,
        series,
    )?;
    Ok(())
}

/// Writes `<stem>.png` and `<stem>.svg` with bars and interval whiskers.
pub fn bar_chart(stem: &Path, title: &str, y_label: &str, bars: &[Bar]) -> Result<()> {
    register_font();
    let png = with_suffix(stem, "png");
    let svg = with_suffix(stem, "svg");
    draw_bars(
        &BitMapBackend::new(&png, (900, 560)).into_drawing_area(),
        title,
        y_label,
        bars,
    )?;
    draw_bars(
        &SVGBackend::new(&svg, (900, 560)).into_drawing_area(),
        title,
        y_label,
        bars,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::step_label;

    #[test]
    fn steps_read_as_people_write_them() {
        let labels: Vec<String> = [
            0.0,
            500.0,
            1000.0,
            1200.0,
            50_000.0,
            1_000_000.0,
            2_500_000.0,
        ]
        .into_iter()
        .map(step_label)
        .collect();
        assert_eq!(labels, ["0", "500", "1k", "1.2k", "50k", "1M", "2.5M"]);
    }
}
