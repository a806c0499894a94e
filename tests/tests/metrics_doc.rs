//! `docs/METRICS.md` lists exactly the metrics the scheduler and the worker declare, with the
//! same type, labels and unit. (Each crate checks that every metric name in its source is in
//! its table, so together: a metric emitted anywhere has a row on the page.)

use std::collections::BTreeMap;
use tangram_shared::metric::MetricDef;

type Row = (String, String, String);

/// The page's rows: name -> (type, labels, unit).
fn page() -> BTreeMap<String, Row> {
    let text = std::fs::read_to_string(tangram_tests::repo_root().join("docs/METRICS.md"))
        .expect("docs/METRICS.md");
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `tangram_")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert!(cells.len() >= 5, "a row has 5 cells: {line}");
        let name = cells[0].trim_matches('`').to_string();
        let labels = if cells[2] == "—" { "" } else { cells[2] };
        let row = (
            cells[1].to_string(),
            labels.to_string(),
            cells[3].to_string(),
        );
        if let Some(old) = rows.insert(name.clone(), row.clone()) {
            assert_eq!(old, row, "{name} listed twice, differently");
        }
    }
    rows
}

fn declared() -> BTreeMap<String, Row> {
    let mut all = BTreeMap::new();
    let defs: Vec<&MetricDef> = tangram_scheduler::metrics::DEFS
        .iter()
        .chain(tangram_worker::metrics::DEFS)
        .collect();
    for d in defs {
        let row = (
            d.kind.as_str().to_string(),
            d.labels.join(", "),
            d.unit.as_str().to_string(),
        );
        if let Some(old) = all.insert(d.name.to_string(), row.clone()) {
            assert_eq!(old, row, "{} declared twice, differently", d.name);
        }
    }
    all
}

#[test]
fn the_reference_page_lists_every_declared_metric_and_nothing_else() {
    let page = page();
    let code = declared();
    let missing: Vec<_> = code.keys().filter(|n| !page.contains_key(*n)).collect();
    let stale: Vec<_> = page.keys().filter(|n| !code.contains_key(*n)).collect();
    assert!(
        missing.is_empty(),
        "emitted but not in docs/METRICS.md: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "in docs/METRICS.md but not emitted: {stale:?}"
    );
    for (name, row) in &code {
        assert_eq!(&page[name], row, "{name}: (type, labels, unit) on the page");
    }
    assert!(code.len() > 50, "both tables were read: {}", code.len());
}
