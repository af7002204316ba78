//! The figures of a 12-variant report (2 environments, 6 methods, 2 batch sizes, 3
//! seeds) read cleanly: in every SVG no two labels overlap (boxes estimated from each
//! text's font size, anchor and rotation) and no number has more than 4 significant
//! digits.

use std::collections::BTreeMap;
use std::path::Path;

use super::grid::RunAxes;
use super::records::Loaded;
use super::records::RunRecord;
use super::summary::build;
use crate::report::settings::ReportConfig;
use crate::run::diagnostics::REPORTED;

const METHODS: [&str; 6] = [
    "none",
    "weight_norm",
    "batch_norm",
    "batch_renorm",
    "group_norm",
    "crossq",
];

fn runs() -> Vec<RunRecord> {
    let mut runs = vec![];
    for (e, env) in ["minatar/breakout", "minatar/space_invaders"]
        .iter()
        .enumerate()
    {
        for (m, method) in METHODS.iter().enumerate() {
            for batch in [4usize, 32] {
                for seed in 1..=3u64 {
                    let level = (1 + m) as f64 * (1.0 + batch as f64 / 32.0) * (1 + e * 4) as f64;
                    let noise = seed as f64 * 0.37;
                    let curve: Vec<(u64, f64)> = (0..=8u64)
                        .map(|k| (k * 25_000, level * k as f64 / 8.0 + noise))
                        .collect();
                    let diagnostics: BTreeMap<String, Vec<(u64, f64)>> = REPORTED
                        .iter()
                        .map(|(name, _)| {
                            let c = (1..=20u64)
                                .map(|k| (k * 10_000, 0.013 * (k + seed) as f64 * (1 + m) as f64))
                                .collect();
                            (name.to_string(), c)
                        })
                        .collect();
                    let variant = format!("b{batch}-{method}");
                    runs.push(RunRecord {
                        env: env.to_string(),
                        axes: RunAxes::of(&variant, None, "none"),
                        variant,
                        seed,
                        final_return: curve.last().map_or(0.0, |p| p.1),
                        auc: level / 2.0,
                        steps_to_threshold: None,
                        wall_seconds: 100.0,
                        steps_per_second: 2000.0,
                        diverged: false,
                        train_curve: curve.iter().map(|&(s, v)| (s + 1_234, v * 0.9)).collect(),
                        eval_curve: curve,
                        diagnostics,
                    });
                }
            }
        }
    }
    runs
}

/// A text's box in pixels: `(x0, y0, x1, y1)`.
pub(super) type Box2 = (f64, f64, f64, f64);

/// Every `<text>` of an SVG written by plotters, with its estimated box.
pub(super) fn texts(svg: &str) -> Vec<(String, Box2)> {
    let mut out = vec![];
    for part in svg.split("<text ").skip(1) {
        let (attrs, rest) = part.split_once('>').expect("a text tag ends");
        let label = rest
            .split("</text>")
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        if label.is_empty() {
            continue;
        }
        let attr = |name: &str| -> Option<String> {
            let start = attrs
                .find(&format!(" {name}=\""))
                .or_else(|| attrs.starts_with(&format!("{name}=\"")).then_some(0))?;
            let from = attrs[start..].find('"')? + start + 1;
            let len = attrs[from..].find('"')?;
            Some(attrs[from..from + len].to_string())
        };
        let num = |name: &str| {
            attr(name)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let (x, y, size) = (num("x"), num("y"), num("font-size"));
        // DejaVu Sans: digits are 0.64 em wide, most letters less.
        let (w, h) = (label.chars().count() as f64 * size * 0.6, size);
        let x0 = match attr("text-anchor").as_deref() {
            Some("middle") => x - w / 2.0,
            Some("end") => x - w,
            _ => x,
        };
        let y0 = match attr("dy").as_deref() {
            Some("0.76em") => y,
            Some("0.5ex") => y - h / 2.0,
            _ => y - h,
        };
        let mut corners = [(x0, y0), (x0 + w, y0), (x0, y0 + h), (x0 + w, y0 + h)];
        if let Some(t) = attr("transform") {
            let degrees: f64 = t
                .trim_start_matches("rotate(")
                .split(',')
                .next()
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let (s, c) = degrees.to_radians().sin_cos();
            for p in &mut corners {
                let (dx, dy) = (p.0 - x, p.1 - y);
                *p = (x + dx * c - dy * s, y + dx * s + dy * c);
            }
        }
        let xs = corners.map(|p| p.0);
        let ys = corners.map(|p| p.1);
        let fold = |v: [f64; 4], f: fn(f64, f64) -> f64| v.into_iter().reduce(f).unwrap();
        out.push((
            label,
            (
                fold(xs, f64::min),
                fold(ys, f64::min),
                fold(xs, f64::max),
                fold(ys, f64::max),
            ),
        ));
    }
    out
}

/// The `width` and `height` of an SVG's root element, in pixels.
fn canvas(svg: &str) -> (f64, f64) {
    let root = &svg[svg.find("<svg").expect("an svg element")..];
    let root = &root[..root.find('>').unwrap()];
    let attr = |name: &str| -> f64 {
        let from = root.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        let len = root[from..].find('"').unwrap();
        root[from..from + len].parse().unwrap()
    };
    (attr("width"), attr("height"))
}

fn overlap(a: &Box2, b: &Box2) -> bool {
    // Touching is fine; a pixel of shared area is not.
    a.0 < b.2 - 1.0 && b.0 < a.2 - 1.0 && a.1 < b.3 - 1.0 && b.1 < a.3 - 1.0
}

/// Significant digits of a number label (`0.125` 3, `1.5M` 2), none for words.
fn significant_digits(label: &str) -> Option<usize> {
    let number = label.trim_end_matches(['k', 'M', 'G', 'T']);
    number.parse::<f64>().ok()?;
    let digits: String = number.chars().filter(char::is_ascii_digit).collect();
    Some(digits.trim_start_matches('0').len().max(1))
}

pub(super) fn check_svg(path: &Path) {
    let svg = std::fs::read_to_string(path).unwrap();
    let texts = texts(&svg);
    assert!(!texts.is_empty(), "{} has no text", path.display());
    let (width, height) = canvas(&svg);
    for (i, (a, boxed)) in texts.iter().enumerate() {
        // Within the canvas: a label past its edge is cut off in the PNG.
        assert!(
            boxed.0 >= -1.0 && boxed.1 >= -1.0 && boxed.2 <= width + 1.0 && boxed.3 <= height + 1.0,
            "{}: '{a}' {boxed:?} leaves the {width}x{height} canvas",
            path.display()
        );
        if let Some(d) = significant_digits(a) {
            assert!(
                d <= 4,
                "{}: label {a} has {d} significant digits",
                path.display()
            );
        }
        for (b, other) in &texts[i + 1..] {
            assert!(
                !overlap(boxed, other),
                "{}: '{a}' {boxed:?} overlaps '{b}' {other:?}",
                path.display()
            );
        }
    }
}

#[test]
fn a_twelve_variant_report_has_no_overlapping_labels() {
    let config = ReportConfig {
        baseline: Some("b32-none".into()),
        ..ReportConfig::default()
    };
    let report = build(
        Loaded {
            runs: runs(),
            ..Loaded::default()
        },
        &config,
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("normrl-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    super::write(&report, &dir).unwrap();
    let svgs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        .collect();
    let names: Vec<String> = svgs
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "batch_size.svg",
        "aggregate.svg",
        "improvement.svg",
        "performance_profile.svg",
        "curves-minatar_breakout.svg",
    ] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    for svg in &svgs {
        check_svg(svg);
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    // The headline comes first, with its sentence.
    let headline = md
        .find("![IQM against batch size](batch_size.png)")
        .expect("headline figure");
    assert!(headline < md.find("aggregate.png").unwrap());
    assert!(md.contains("From batch 32 to batch 4, **"), "{md}");
    if std::env::var_os("KEEP").is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    } else {
        eprintln!("{}", dir.display());
    }
}

#[test]
fn the_checker_sees_overlaps_and_long_numbers() {
    let svg = r#"<text x="100" y="50" dy="0.5ex" text-anchor="middle" font-size="10">label one</text>
<text x="110" y="52" dy="0.5ex" text-anchor="middle" font-size="10">label two</text>"#;
    let t = texts(svg);
    assert!(overlap(&t[0].1, &t[1].1));
    let apart = r#"<text x="0" y="0" dy="0.76em" text-anchor="start" font-size="10">a</text>
<text x="0" y="20" dy="0.76em" text-anchor="start" font-size="10">b</text>"#;
    let t = texts(apart);
    assert!(!overlap(&t[0].1, &t[1].1));
    assert_eq!(significant_digits("0.6000000000000001"), Some(16));
    assert_eq!(significant_digits("1.5M"), Some(2));
    assert_eq!(significant_digits("batch"), None);
}
