//! promtool accepts the shipped scrape config and alert rules, and the reference page, the
//! dashboard and the rules agree on what they read.

use std::process::Command;
use tangram_tests::prometheus::{
    alert_exprs, dashboard_exprs, dashboard_exprs_of, selectors, tool, MISSING,
};
use tangram_tests::{output_text, repo_root};

fn promtool(args: &[&str]) {
    let Some(bin) = tool("promtool") else {
        eprintln!("SKIPPED: {MISSING}");
        return;
    };
    let out = Command::new(bin)
        .args(args)
        .current_dir(repo_root().join("deploy"))
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}",
        output_text(&out)
    );
}

#[test]
fn promtool_accepts_the_alert_rules() {
    promtool(&["check", "rules", "alerts.yml"]);
}

#[test]
fn promtool_accepts_the_scrape_config() {
    promtool(&["check", "config", "prometheus.yml"]);
}

#[test]
fn the_dashboard_and_the_rules_read_only_documented_metrics() {
    let page = std::fs::read_to_string(repo_root().join("docs/METRICS.md")).unwrap();
    let exprs: Vec<String> = dashboard_exprs()
        .unwrap()
        .into_iter()
        .chain(dashboard_exprs_of("tangram-gpus.json").unwrap())
        .chain(alert_exprs().unwrap())
        .collect();
    assert!(exprs.len() > 25, "expressions found: {exprs:?}");
    for sel in exprs.iter().flat_map(|e| selectors(e)) {
        let name = sel.split('{').next().unwrap();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|b| page.contains(&format!("| `{b}` | histogram")))
            .unwrap_or(name);
        assert!(
            page.contains(&format!("| `{base}` |")),
            "{sel} is queried but {base} is not in docs/METRICS.md"
        );
    }
}
