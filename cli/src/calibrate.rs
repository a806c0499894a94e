//! `tangram calibrate`: the calibration maps (docs/CALIBRATION.md), each printed as a table,
//! written as a heat-map SVG, and optionally as one JSON object.

use crate::progress;
use crate::svg::escape;
use anyhow::Context as _;
use serde_json::json;
use std::fmt::Write as _;
use std::path::PathBuf;
use tangram_core::sim::calibrate::{self, Map, Scale, MAPS};

#[derive(Debug, clap::Args)]
pub(crate) struct CalibrateArgs {
    /// Maps to run, comma-separated (all by default): coding-pods, coding-capacity,
    /// coding-start, coding-turns, mopd-gpus, deepsearch-quota.
    #[arg(long)]
    maps: Option<String>,
    /// A few small cells per map instead of the documented sweep (seconds instead of
    /// minutes; the figures mean nothing at that size).
    #[arg(long)]
    small: bool,
    /// Where the pictures go, one `calibration-<map>.svg` per map.
    #[arg(long, default_value = ".")]
    svg_dir: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

pub(crate) fn calibrate(args: CalibrateArgs) -> anyhow::Result<()> {
    let names: Vec<String> = match &args.maps {
        Some(m) => m
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => MAPS.iter().map(|s| s.to_string()).collect(),
    };
    for n in &names {
        if !MAPS.contains(&n.as_str()) {
            crate::usage!("unknown map {n:?}; available: {}", MAPS.join(", "));
        }
    }
    let scale = if args.small {
        Scale::Small
    } else {
        Scale::Full
    };
    std::fs::create_dir_all(&args.svg_dir)
        .with_context(|| format!("creating {}", args.svg_dir.display()))?;
    let spinner = progress::Spinner::start("calibrating");
    let mut maps = Vec::new();
    for n in &names {
        spinner.set_message(format!("map {n}"));
        let map = calibrate::run(n, scale, &mut |done, total| {
            spinner.set_count(done as u64, total as u64)
        })
        .expect("checked above");
        let path = args.svg_dir.join(format!("calibration-{n}.svg"));
        std::fs::write(&path, heatmap(&map))
            .with_context(|| format!("writing {}", path.display()))?;
        maps.push((map, path));
    }
    spinner.finish();
    if args.json {
        let out: Vec<_> = maps
            .iter()
            .map(|(m, path)| {
                json!({
                    "map": m.name, "title": m.title, "x": m.x_label, "y": m.y_label,
                    "xs": m.xs, "ys": m.ys, "value": m.value, "fixed": m.fixed,
                    "values": m.values.iter().map(|r| r.iter().map(|v| if v.is_nan() { None } else { Some(*v) }).collect::<Vec<_>>()).collect::<Vec<_>>(),
                    "targets": m.targets.iter().map(|t| json!({"value": t.value, "label": t.label, "x": t.x})).collect::<Vec<_>>(),
                    "svg": path.display().to_string(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({ "maps": out }))?);
    } else {
        for (m, path) in &maps {
            print!("{}", table(m));
            println!("picture: {}\n", path.display());
        }
    }
    Ok(())
}

fn cell(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn axis(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

/// The map as a text table: rows are y, columns x.
fn table(m: &Map) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{} ({})", m.title, m.value);
    let _ = writeln!(s, "fixed: {}", m.fixed);
    let _ = write!(
        s,
        "{:>28} |",
        format!("{} \\ {}", m.y_label, m.x_label)
            .chars()
            .take(28)
            .collect::<String>()
    );
    for x in &m.xs {
        let _ = write!(s, " {:>8}", axis(*x));
    }
    let _ = writeln!(s);
    for (y, row) in m.ys.iter().zip(&m.values) {
        let _ = write!(s, "{:>28} |", axis(*y));
        for v in row {
            let _ = write!(s, " {:>8}", cell(*v));
        }
        let _ = writeln!(s);
    }
    let targets: Vec<&str> = m.targets.iter().map(|t| t.label).collect();
    let _ = writeln!(s, "paper: {}", targets.join(", "));
    s
}

/// A heat map: log-scaled colour (white at 1, dark at the largest value), each cell labelled
/// with its value and outlined where it is within 15% of one of the paper's figures.
pub(crate) fn heatmap(m: &Map) -> String {
    let (cw, ch) = (92.0, 44.0);
    let (x0, y0) = (150.0, 86.0);
    let w = (x0 + cw * m.xs.len() as f64 + 40.0).max(760.0);
    let h = y0 + ch * m.ys.len() as f64 + 110.0;
    let finite: Vec<f64> = m
        .values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    let lo = finite
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .clamp(1e-3, 1.0);
    let hi = finite.iter().copied().fold(0.0, f64::max).max(lo * 1.01);
    let mut s = crate::svg::open(w, h, &m.title);
    let _ = writeln!(
        s,
        r##"<text x="{}" y="42" text-anchor="middle" fill="#555">{}</text>"##,
        w / 2.0,
        escape(&format!("cell: {}; fixed: {}", m.value, m.fixed))
    );
    for (j, (y, row)) in m.ys.iter().zip(&m.values).enumerate() {
        let yy = y0 + ch * (m.ys.len() - 1 - j) as f64;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            x0 - 8.0,
            yy + ch / 2.0 + 4.0,
            axis(*y)
        );
        for (i, v) in row.iter().enumerate() {
            let xx = x0 + cw * i as f64;
            let (fill, ink) = if v.is_finite() {
                let t = ((v.max(lo) / lo).ln() / (hi / lo).ln()).clamp(0.0, 1.0);
                // White to dark blue.
                let c = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
                let rgb = (c(255.0, 8.0), c(255.0, 48.0), c(255.0, 107.0));
                (
                    format!("#{:02x}{:02x}{:02x}", rgb.0, rgb.1, rgb.2),
                    if t > 0.55 { "white" } else { "black" },
                )
            } else {
                ("#eeeeee".to_string(), "black")
            };
            let near = v.is_finite() && m.targets.iter().any(|t| t.near(m.xs[i], *v, 0.15));
            let stroke = if near {
                r##"stroke="#d62728" stroke-width="3""##
            } else {
                r##"stroke="#ccc""##
            };
            let _ = writeln!(
                s,
                r#"<rect x="{xx}" y="{yy}" width="{cw}" height="{ch}" fill="{fill}" {stroke}/>"#
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle" fill="{ink}">{}</text>"#,
                xx + cw / 2.0,
                yy + ch / 2.0 + 4.0,
                cell(*v)
            );
        }
    }
    for (i, x) in m.xs.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            x0 + cw * i as f64 + cw / 2.0,
            y0 + ch * m.ys.len() as f64 + 18.0,
            axis(*x)
        );
    }
    let bottom = y0 + ch * m.ys.len() as f64;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        x0 + cw * m.xs.len() as f64 / 2.0,
        bottom + 40.0,
        escape(m.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="20" y="{}" transform="rotate(-90 20 {})" text-anchor="middle">{}</text>"#,
        y0 + ch * m.ys.len() as f64 / 2.0,
        y0 + ch * m.ys.len() as f64 / 2.0,
        escape(m.y_label)
    );
    let targets: Vec<&str> = m.targets.iter().map(|t| t.label).collect();
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" text-anchor="middle" fill="#d62728">outlined: within 15% of the paper's {}</text>"##,
        w / 2.0,
        bottom + 66.0,
        escape(&targets.join(", "))
    );
    let _ = writeln!(s, "</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tangram_core::sim::calibrate::Target;

    #[test]
    fn the_heat_map_outlines_cells_near_a_target_and_greys_undefined_ones() {
        let m = Map {
            name: "t",
            title: "t <x>".into(),
            x_label: "x",
            y_label: "y",
            xs: vec![1.0, 2.0],
            ys: vec![1.0],
            values: vec![vec![4.2, f64::NAN]],
            value: "v",
            targets: vec![Target {
                value: 4.3,
                label: "4.3x",
                x: None,
            }],
            fixed: "f".into(),
        };
        let svg = heatmap(&m);
        assert_eq!(svg.matches("stroke=\"#d62728\"").count(), 1, "{svg}");
        assert!(svg.contains("#eeeeee"));
        assert!(svg.contains("t &lt;x&gt;"));
        let t = table(&m);
        assert!(t.contains("4.20") && t.contains(" -"), "{t}");
    }
}
