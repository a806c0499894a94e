//! `tangram calibrate`: the calibration maps (docs/CALIBRATION.md), each printed as a table,
//! written as a heat-map SVG, and optionally as one JSON object.

use crate::picture::{axis, cell, heatmap};
use crate::progress;
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
        std::fs::write(&path, heatmap(&map)?)
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
        let svg = heatmap(&m).unwrap();
        assert_eq!(
            svg.matches(r##"stroke="#D62728" stroke-width="3""##)
                .count(),
            1,
            "{svg}"
        );
        assert!(svg.contains("#EEEEEE"));
        assert!(svg.contains("t &lt;x&gt;"));
        let t = table(&m);
        assert!(t.contains("4.20") && t.contains(" -"), "{t}");
    }
}
