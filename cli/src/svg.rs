//! A dependency-free SVG of a simulation: the ACT distribution (CDF) per policy and the
//! pool's utilisation over time per policy.

use std::fmt::Write as _;
use tangram_core::sim::SimReport;

const COLORS: [&str; 9] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#17becf",
];

/// A white canvas of `w` x `h` with `title` centred on top (close it with `</svg>`).
pub(crate) fn open(w: f64, h: f64, title: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        w / 2.0,
        escape(title)
    );
    s
}

/// Renders the two panels side by side.
pub fn render(title: &str, reports: &[SimReport]) -> String {
    let (w, h) = (1200.0, 460.0);
    let mut s = open(w, h, title);

    // Panel 1: CDF of ACT, log-scaled x.
    let (x0, y0, pw, ph) = (60.0, 50.0, 460.0, 340.0);
    let all: Vec<f64> = reports
        .iter()
        .flat_map(|r| r.acts_ms())
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1.0)
        .log10()
        .floor();
    let hi = all
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .max(10.0)
        .log10()
        .ceil()
        .max(lo + 1.0);
    axes(
        &mut s,
        x0,
        y0,
        pw,
        ph,
        "ACT (s, log scale)",
        "fraction of actions",
    );
    let mut e = lo;
    while e <= hi {
        let x = x0 + (e - lo) / (hi - lo) * pw;
        let _ = writeln!(
            s,
            r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#,
            y0 + ph + 16.0,
            fmt_s(10f64.powf(e) / 1e3)
        );
        e += 1.0;
    }
    for (i, r) in reports.iter().enumerate() {
        let acts = r.acts_ms();
        if acts.is_empty() {
            continue;
        }
        let step = (acts.len() / 300).max(1);
        let mut pts = String::new();
        for (k, v) in acts
            .iter()
            .enumerate()
            .step_by(step)
            .chain(std::iter::once((acts.len() - 1, &acts[acts.len() - 1])))
        {
            let x = x0 + ((v.max(1.0).log10() - lo) / (hi - lo)).clamp(0.0, 1.0) * pw;
            let y = y0 + ph - (k + 1) as f64 / acts.len() as f64 * ph;
            let _ = write!(pts, "{x:.1},{y:.1} ");
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{pts}"/>"#,
            COLORS[i % COLORS.len()]
        );
    }

    // Panel 2: utilisation over time.
    let (x1, pw2) = (600.0, 460.0);
    let tmax = reports
        .iter()
        .flat_map(|r| r.utilisation.last().map(|u| u.0))
        .fold(1.0, f64::max);
    axes(&mut s, x1, y0, pw2, ph, "time (s)", "pool cores held");
    for k in 0..=4 {
        let t = tmax * k as f64 / 4.0;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            x1 + pw2 * k as f64 / 4.0,
            y0 + ph + 16.0,
            fmt_s(t / 1e3)
        );
    }
    for (i, r) in reports.iter().enumerate() {
        let step = (r.utilisation.len() / 400).max(1);
        let mut pts = String::new();
        for (t, u) in r.utilisation.iter().step_by(step) {
            let _ = write!(
                pts,
                "{:.1},{:.1} ",
                x1 + t / tmax * pw2,
                y0 + ph - u.clamp(0.0, 1.0) * ph
            );
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.5" points="{pts}"/>"#,
            COLORS[i % COLORS.len()]
        );
    }

    // Legend.
    for (i, r) in reports.iter().enumerate() {
        let x = 60.0 + (i as f64) * 128.0;
        let y = h - 20.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="14" height="4" fill="{}"/>"#,
            y - 4.0,
            COLORS[i % COLORS.len()]
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{y}">{}</text>"#,
            x + 18.0,
            escape(&r.policy)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn axes(s: &mut String, x: f64, y: f64, w: f64, h: f64, xlabel: &str, ylabel: &str) {
    let _ = writeln!(
        s,
        r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="none" stroke="dimgray"/>"#
    );
    for k in 0..=4 {
        let yy = y + h - h * k as f64 / 4.0;
        let _ = writeln!(
            s,
            r#"<line x1="{x}" x2="{}" y1="{yy}" y2="{yy}" stroke="gainsboro"/>"#,
            x + w
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{:.2}</text>"#,
            x - 4.0,
            yy + 4.0,
            k as f64 / 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        x + w / 2.0,
        y + h + 34.0,
        escape(xlabel)
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>"#,
        x - 40.0,
        y + h / 2.0,
        x - 40.0,
        y + h / 2.0,
        escape(ylabel)
    );
}

fn fmt_s(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

pub(crate) fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
