//! The source's shape, kept: no import cycle between the top-level modules of any crate (a
//! module uses another through `crate::`; comments and test modules aside), and no file of
//! the scheduler service over 400 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use tangram_tests::repo_root;

const CRATES: [&str; 6] = [
    "scheduler/core/src",
    "scheduler/src",
    "cli/src",
    "shared/src",
    "worker/src",
    "nats/src",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`None` for the crate root itself).
fn top_module(root: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root).unwrap();
    let first = rel
        .components()
        .next()?
        .as_os_str()
        .to_string_lossy()
        .to_string();
    let name = first.trim_end_matches(".rs").to_string();
    (!matches!(name.as_str(), "lib" | "main")).then_some(name)
}

/// Each top-level module and the top-level modules it uses.
fn uses(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(module) = top_module(root, &file) else {
            continue;
        };
        if file.components().any(|c| c.as_os_str() == "tests")
            || file.file_name().is_some_and(|n| n == "tests.rs")
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or("");
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for piece in line.split("crate::").skip(1) {
                let used: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !used.is_empty() && used != module {
                    edges.entry(module.clone()).or_default().insert(used);
                }
            }
        }
    }
    edges
}

/// A cycle through `start`, if there is one: the path back to it.
fn cycle_from(edges: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_string(), vec![start.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in edges.get(&at).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(start.to_string());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_cycle_between_its_top_level_modules() {
    let mut cycles = Vec::new();
    for krate in CRATES {
        let edges = uses(&repo_root().join(krate));
        assert!(!edges.is_empty(), "{krate}: nothing read");
        for module in edges.keys() {
            if let Some(c) = cycle_from(&edges, module) {
                cycles.push(format!("{krate}: {}", c.join(" -> ")));
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("a".into()).or_default().insert("b".into());
    edges.entry("b".into()).or_default().insert("c".into());
    assert!(cycle_from(&edges, "a").is_none());
    edges.entry("c".into()).or_default().insert("a".into());
    assert_eq!(cycle_from(&edges, "a").unwrap(), ["a", "b", "c", "a"]);
}

#[test]
fn no_file_of_the_scheduler_service_is_over_400_lines() {
    let mut files = Vec::new();
    rust_files(&repo_root().join("scheduler/src"), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 400).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "{long:?}");
}
