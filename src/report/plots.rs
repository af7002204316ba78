//! The report's figures as PNG and SVG, drawn with plotters and an embedded font
//! (DejaVu Sans) so that no system font is needed. A figure is a grid of panels that
//! share one legend, drawn outside the data on the right: line panels (curves with
//! bands) and interval panels (rliable's horizontal intervals, one row per method).
//! Labels are placed so that none overlap whatever the number of variants (a test
//! checks the SVG), and every number is written as people write it.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::scale::YScale;

/// Pixels of one panel, and of the legend beside the panels.
const PANEL: (u32, u32) = (430, 320);
const LEGEND_WIDTH: u32 = 190;
const TITLE_HEIGHT: u32 = 40;
/// Font sizes (pixels): the figure's title, a panel's title, axis labels and ticks.
const TITLE_FONT: u32 = 22;
const PANEL_FONT: u32 = 16;
const LABEL_FONT: u32 = 14;
const TICK_FONT: u32 = 12;
/// A legend entry's height: more than its font, so entries never touch.
const LEGEND_ROW: i32 = 22;

/// A color as the palette gives it.
pub type Rgb = (u8, u8, u8);

/// How a line is drawn. Solid unless a panel holds several lines of one color (a
/// method under two samplers), which then differ by stroke as well as lightness.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stroke {
    #[default]
    Solid,
    Dashed,
    Dotted,
}

/// One line with a band.
pub struct Line {
    pub color: Rgb,
    pub stroke: Stroke,
    pub points: Vec<Point>,
}

/// One legend entry: a label beside a short line in its color and stroke.
pub struct Key {
    pub label: String,
    pub color: Rgb,
    pub stroke: Stroke,
}

/// A point of a line: `(x, y, low, high)`.
pub type Point = (f64, f64, f64, f64);

/// One row of an interval panel: a label, its color and the estimate with its interval.
pub struct Row {
    pub label: String,
    pub color: Rgb,
    pub value: f64,
    pub low: f64,
    pub high: f64,
}

/// What a panel draws.
pub enum Content {
    /// Curves over `x`, with named ticks where the axis is categorical (batch sizes).
    Lines {
        lines: Vec<Line>,
        x_ticks: Option<Vec<(f64, String)>>,
    },
    /// Horizontal intervals, one row per label, with a dashed reference line at `mark`;
    /// `range` fixes the axis where the quantity has one (a probability's [0, 1]).
    Intervals {
        rows: Vec<Row>,
        mark: Option<f64>,
        range: Option<(f64, f64)>,
    },
    /// Nothing: a gap that keeps a grid's rows and columns aligned (a setting the grid
    /// did not run).
    Blank,
}

pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub content: Content,
}

/// A grid of panels (`columns` wide) with one legend.
pub struct Figure {
    pub title: String,
    pub columns: usize,
    pub panels: Vec<Panel>,
    pub legend: Vec<Key>,
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting failed: {e:?}")
}

fn rgb(c: Rgb) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

/// `c` moved `t` of the way to white (0: itself, 1: white).
pub fn lighter(c: Rgb, t: f64) -> Rgb {
    let mix = |v: u8| (f64::from(v) + (255.0 - f64::from(v)) * t).round() as u8;
    (mix(c.0), mix(c.1), mix(c.2))
}

/// A path of `points` in `stroke`: dashes and dots are long enough at 2 pixels wide to
/// tell apart in a PNG.
fn draw_path<DB: DrawingBackend, C: Into<ShapeStyle>>(
    area: &DrawingArea<DB, Shift>,
    points: Vec<(i32, i32)>,
    stroke: Stroke,
    style: C,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let style: ShapeStyle = style.into();
    match stroke {
        Stroke::Solid => area.draw(&PathElement::new(points, style)),
        Stroke::Dashed => area.draw(&DashedPathElement::new(points, 8, 5, style)),
        Stroke::Dotted => area.draw(&DashedPathElement::new(points, 2, 4, style)),
    }
    .map_err(err)
}

/// A number as people write it: at most 4 significant digits (3 before a unit), no
/// trailing zeros, and thousands up to 10^12 as k, M, G and T (0.6, 12.5, 1.2k, 50k, 1.5M).
pub fn tick_label(x: f64) -> String {
    if !x.is_finite() {
        return String::new();
    }
    let a = x.abs();
    // A tick stepped to zero in floating point (-0.2 + 0.2) is zero, not -5.551e-17.
    if a < 1e-9 {
        return "0".into();
    }
    if a >= 1e12 {
        return format!("{}T", significant(x / 1e12, 3));
    }
    if a >= 1e9 {
        return format!("{}G", significant(x / 1e9, 3));
    }
    if a >= 1e6 {
        return format!("{}M", significant(x / 1e6, 3));
    }
    if a >= 1e3 {
        return format!("{}k", significant(x / 1e3, 3));
    }
    significant(x, 4)
}

/// `x` with at most `digits` significant digits, trailing zeros dropped.
fn significant(x: f64, digits: i32) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let magnitude = x.abs().log10().floor() as i32;
    let decimals = (digits - 1 - magnitude).max(0) as usize;
    let text = format!("{x:.decimals$}");
    let text = match text.contains('.') {
        true => text.trim_end_matches('0').trim_end_matches('.').to_string(),
        false => text,
    };
    if text == "-0" {
        "0".into()
    } else {
        text
    }
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.06).max(1e-6);
    (lo - pad, hi + pad)
}

fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&BLACK)
}

/// The y axis the curves of `figure` share: its scale (symmetric-log where they span
/// decades) and its range on that scale.
fn curve_axis(figure: &Figure) -> (YScale, (f64, f64)) {
    let lines = || {
        figure.panels.iter().flat_map(|p| match &p.content {
            Content::Lines { lines, .. } => lines.as_slice(),
            _ => &[],
        })
    };
    let scale = YScale::of(lines().flat_map(|l| l.points.iter().map(|p| p.1)));
    let ends = lines().flat_map(|l| l.points.iter().flat_map(|p| [p.1, p.2, p.3]));
    (scale, bounds(ends.map(|v| scale.axis(v))))
}

/// `lines` with their values where `scale` puts them.
fn on_axis(lines: &[Line], scale: YScale) -> Vec<Line> {
    let at = |v: f64| scale.axis(v);
    let point = |p: &Point| (p.0, at(p.1), at(p.2), at(p.3));
    let line = |l: &Line| Line {
        points: l.points.iter().map(point).collect(),
        ..*l
    };
    lines.iter().map(line).collect()
}

fn draw_figure<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, figure: &Figure) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let (width, _) = root.dim_in_pixel();
    let centered = font(TITLE_FONT).pos(Pos::new(HPos::Center, VPos::Center));
    root.draw_text(
        &figure.title,
        &centered,
        ((width / 2) as i32, (TITLE_HEIGHT / 2) as i32),
    )
    .map_err(err)?;
    let body = root.margin(TITLE_HEIGHT, 0, 0, 0);
    let columns = figure.columns.max(1);
    let (panels, legend) = body.split_horizontally(columns as u32 * PANEL.0);
    let rows = figure.panels.len().div_ceil(columns).max(1);
    // Panels share their value axis (a figure's curves one y range, each column of
    // intervals one x range), so that a method reads the same across settings.
    let (scale, y_range) = curve_axis(figure);
    let x_range = |column: usize| {
        bounds(
            figure
                .panels
                .iter()
                .skip(column)
                .step_by(columns)
                .flat_map(|p| match &p.content {
                    Content::Intervals { rows, mark, range } => rows
                        .iter()
                        .flat_map(|r| [r.low, r.high, r.value])
                        .chain(*mark)
                        .chain(range.iter().flat_map(|r| [r.0, r.1]))
                        .collect(),
                    _ => vec![],
                }),
        )
    };
    let areas = panels.split_evenly((rows, columns));
    for (i, (area, panel)) in areas.iter().zip(&figure.panels).enumerate() {
        match &panel.content {
            Content::Lines { lines, x_ticks } => {
                let axis = (y_range, scale);
                let lines = on_axis(lines, scale);
                draw_lines(area, panel, &lines, x_ticks.as_deref(), axis)?
            }
            Content::Intervals { rows, mark, .. } => {
                draw_intervals(area, panel, rows, *mark, x_range(i % columns))?
            }
            Content::Blank => {}
        }
    }
    draw_legend(&legend, &figure.legend)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The legend, one entry a row, outside every panel.
fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, entries: &[Key]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let style = font(LABEL_FONT).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, key) in entries.iter().enumerate() {
        let y = 30 + i as i32 * LEGEND_ROW;
        // Long enough to show two dashes of a dashed line.
        let path = vec![(8, y), (36, y)];
        draw_path(area, path, key.stroke, rgb(key.color).stroke_width(3))?;
        area.draw_text(&key.label, &style, (44, y)).map_err(err)?;
    }
    Ok(())
}

fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    lines: &[Line],
    x_ticks: Option<&[(f64, String)]>,
    ((y0, y1), scale): ((f64, f64), YScale),
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let tick_xs = x_ticks.unwrap_or_default().iter().map(|t| t.0);
    let xs = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .chain(tick_xs);
    let (x0, x1) = bounds(xs);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, font(PANEL_FONT))
        .margin(10)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let label = |v: &f64| tick_label(*v);
    let y_ticks = scale.ticks((y0, y1));
    let y_desc = match scale {
        YScale::Linear => panel.y_label.clone(),
        YScale::SymLog { .. } => format!("{} (symlog)", panel.y_label),
    };
    chart
        .configure_mesh()
        .x_desc(&panel.x_label)
        .y_desc(&y_desc)
        .axis_desc_style(font(LABEL_FONT))
        .label_style(font(TICK_FONT))
        .x_labels(if x_ticks.is_some() { 0 } else { 5 })
        .y_labels(if y_ticks.is_empty() { 5 } else { 0 })
        .x_label_formatter(&label)
        .y_label_formatter(&label)
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    let base = area.get_base_pixel();
    if let Some(ticks) = x_ticks {
        let style = font(TICK_FONT).pos(Pos::new(HPos::Center, VPos::Top));
        for (x, text) in ticks {
            let (px, py) = chart.backend_coord(&(*x, y0));
            area.draw_text(text, &style, (px - base.0, py - base.1 + 6))
                .map_err(err)?;
        }
    }
    // A symmetric-log axis's ticks, which plotters cannot place: a label and a grid line
    // at each.
    let style = font(TICK_FONT).pos(Pos::new(HPos::Right, VPos::Center));
    for &(at, value) in &y_ticks {
        let grid = [(x0, at), (x1, at)];
        chart
            .draw_series(std::iter::once(PathElement::new(grid, BLACK.mix(0.2))))
            .map_err(err)?;
        let (px, py) = chart.backend_coord(&(x0, at));
        area.draw_text(&tick_label(value), &style, (px - base.0 - 6, py - base.1))
            .map_err(err)?;
    }
    for line in lines {
        draw_curve(&mut chart, line)?;
    }
    Ok(())
}

/// A panel's chart: numbers on both axes.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One line of a panel: its band, its path in its stroke, and marks on its points where
/// it has few.
fn draw_curve<DB: DrawingBackend>(chart: &mut Chart<'_, DB>, line: &Line) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let color = rgb(line.color);
    let mut band: Vec<(f64, f64)> = line.points.iter().map(|p| (p.0, p.3)).collect();
    band.extend(line.points.iter().rev().map(|p| (p.0, p.2)));
    chart
        .draw_series(std::iter::once(Polygon::new(band, color.mix(0.15))))
        .map_err(err)?;
    let path = line.points.iter().map(|p| (p.0, p.1));
    let style = color.stroke_width(2);
    match line.stroke {
        Stroke::Solid => chart.draw_series(LineSeries::new(path, style)),
        Stroke::Dashed => chart.draw_series(DashedLineSeries::new(path, 8, 5, style)),
        Stroke::Dotted => chart.draw_series(DashedLineSeries::new(path, 2, 4, style)),
    }
    .map_err(err)?;
    if line.points.len() <= 8 {
        // Hollow marks on a broken line: the two read apart where they cross.
        let mark = match line.stroke {
            Stroke::Solid => color.filled(),
            _ => color.stroke_width(2),
        };
        let marks = line.points.iter().map(|p| Circle::new((p.0, p.1), 3, mark));
        chart.draw_series(marks).map_err(err)?;
    }
    Ok(())
}

/// rliable's interval plot: a box from low to high per row, a black tick at the value;
/// row labels left of the axis, written by hand so that each sits at its row.
fn draw_intervals<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    rows: &[Row],
    mark: Option<f64>,
    (x0, x1): (f64, f64),
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let n = rows.len().max(1) as f64;
    let label_width = 12
        + rows
            .iter()
            .map(|r| text_width(&r.label, TICK_FONT))
            .max()
            .unwrap_or(0);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, font(PANEL_FONT))
        .margin(10)
        .x_label_area_size(44)
        .y_label_area_size(label_width)
        .build_cartesian_2d(x0..x1, -0.5..n - 0.5)
        .map_err(err)?;
    let label = |v: &f64| tick_label(*v);
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_labels(5)
        .x_desc(&panel.x_label)
        .axis_desc_style(font(LABEL_FONT))
        .label_style(font(TICK_FONT))
        .x_label_formatter(&label)
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    if let Some(m) = mark {
        let dashed = (0..20).map(|k| {
            let y = -0.5 + n * f64::from(k) / 20.0;
            PathElement::new(vec![(m, y), (m, y + n / 40.0)], BLACK.mix(0.5))
        });
        chart.draw_series(dashed).map_err(err)?;
    }
    let style = font(TICK_FONT).pos(Pos::new(HPos::Right, VPos::Center));
    let base = area.get_base_pixel();
    // The first row at the top, as a table reads.
    for (i, row) in rows.iter().enumerate() {
        let y = n - 1.0 - i as f64;
        let color = rgb(row.color);
        let boxed = Rectangle::new(
            [(row.low, y - 0.3), (row.high, y + 0.3)],
            color.mix(0.7).filled(),
        );
        chart.draw_series(std::iter::once(boxed)).map_err(err)?;
        let tick = PathElement::new(
            vec![(row.value, y - 0.3), (row.value, y + 0.3)],
            BLACK.stroke_width(2),
        );
        chart.draw_series(std::iter::once(tick)).map_err(err)?;
        let (px, py) = chart.backend_coord(&(x0, y));
        area.draw_text(&row.label, &style, (px - base.0 - 6, py - base.1))
            .map_err(err)?;
    }
    Ok(())
}

/// A generous estimate of a label's width in pixels (DejaVu Sans averages about 0.55
/// of its size a character).
pub fn text_width(text: &str, size: u32) -> u32 {
    (text.chars().count() as f64 * size as f64 * 0.62).ceil() as u32
}

/// `<stem>.<ext>`, whatever dots the stem holds (`Path::with_extension` would replace
/// what follows the last one).
fn with_suffix(stem: &Path, ext: &str) -> PathBuf {
    let mut name = stem.as_os_str().to_owned();
    name.push(".");
    name.push(ext);
    name.into()
}

/// The legend's column: none without entries, else wide enough for the longest label
/// (`wn_mean_only_bn_init256` overran the fixed width), at about 9 pixels a character
/// of the legend's font beside the entry's line.
fn legend_width(legend: &[Key]) -> u32 {
    let longest = legend.iter().map(|k| k.label.chars().count()).max();
    longest.map_or(0, |n| LEGEND_WIDTH.max(60 + 9 * n as u32))
}

/// Writes `<stem>.png` and `<stem>.svg`.
pub fn write(stem: &Path, figure: &Figure) -> Result<()> {
    crate::logging::font::register_font();
    let columns = figure.columns.max(1);
    let rows = figure.panels.len().div_ceil(columns).max(1) as u32;
    let legend_rows = figure.legend.len() as u32 * LEGEND_ROW as u32 + 40;
    // Wide enough for the title too: a figure of one or two panels is narrower than
    // its longer titles.
    let title_width = 40 + (figure.title.chars().count() as f64 * TITLE_FONT as f64 * 0.62) as u32;
    let size = (
        (columns as u32 * PANEL.0 + legend_width(&figure.legend)).max(title_width),
        TITLE_HEIGHT + (rows * PANEL.1).max(legend_rows),
    );
    let png = with_suffix(stem, "png");
    draw_figure(&BitMapBackend::new(&png, size).into_drawing_area(), figure)?;
    let svg = with_suffix(stem, "svg");
    draw_figure(&SVGBackend::new(&svg, size).into_drawing_area(), figure)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::tick_label;

    #[test]
    fn numbers_read_as_people_write_them() {
        let cases = [
            (0.0, "0"),
            (0.6000000000000001, "0.6"),
            (0.05, "0.05"),
            (12.5, "12.5"),
            (-0.25, "-0.25"),
            (500.0, "500"),
            (1000.0, "1k"),
            (1234.5, "1.23k"),
            (1200.0, "1.2k"),
            (50_000.0, "50k"),
            (1_000_000.0, "1M"),
            (2_500_000.0, "2.5M"),
            (0.123456, "0.1235"),
            (-5.551115123125783e-17, "0"),
        ];
        for (x, want) in cases {
            assert_eq!(tick_label(x), want, "{x}");
        }
    }
}
