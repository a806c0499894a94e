//! The story as a person reads it: the action, its dispatches, its result(s), any dead
//! letter, and the timeline with the ACT split.

use super::*;

/// Renders the story for a person.
pub fn render(s: &Story) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "action {} (job {})",
        s.id,
        s.job.as_deref().unwrap_or("?")
    );
    if let Some(a) = &s.action {
        let body = serde_json::to_string_pretty(&a.body).unwrap_or_default();
        let _ = writeln!(
            o,
            "\nstored as #{} on {} ({}):",
            a.seq, a.subject, a.encoding
        );
        for line in body.lines() {
            let _ = writeln!(o, "  {line}");
        }
    }
    if !s.dispatches.is_empty() {
        let _ = writeln!(o, "\ndispatches:");
        let mut t = crate::table::new([
            "seq", "worker", "epoch", "attempt", "cores", "mem_mb", "gpu",
        ]);
        crate::table::left(&mut t, &[1, 6]);
        crate::table::right(&mut t, &[0]);
        for d in &s.dispatches {
            t.add_row([
                d.seq.to_string(),
                d.worker.to_string(),
                d.epoch.to_string(),
                d.attempt.to_string(),
                d.grant.cores.to_string(),
                d.grant.mem_mb.to_string(),
                d.gpu.as_ref().map_or("-".to_string(), |g| {
                    format!(
                        "{} g{}:{}+{}{}",
                        g.service,
                        g.chunk.group,
                        g.chunk.start,
                        g.chunk.len,
                        if g.restore { " restore" } else { "" }
                    )
                }),
            ]);
        }
        o.push_str(&crate::table::render(&t, "  "));
    }
    for r in &s.results {
        let _ = writeln!(o, "\nresult #{}: {}", r.seq, outcome_text(&r.result));
        if let Some(p) = &r.result.placement {
            let _ = writeln!(
                o,
                "  ran on {} with {} cores {}",
                p.worker, p.cores, p.cpuset
            );
        }
        for (name, text) in [("stdout", &r.result.stdout), ("stderr", &r.result.stderr)] {
            if !text.is_empty() {
                let first: String = text.lines().take(5).collect::<Vec<_>>().join("\n    ");
                let _ = writeln!(o, "  {name}: {first}");
            }
        }
        if let Some(sc) = &r.result.scores {
            let _ = writeln!(o, "  scores: {sc:?}");
        }
        if let Some(h) = &r.result.http {
            let _ = writeln!(o, "  http {} ({} bytes)", h.status, h.body.len());
        }
    }
    for d in &s.deadletters {
        let _ = writeln!(
            o,
            "\ndead letter #{}: {}: {}{}",
            d.seq,
            d.code,
            d.reason,
            d.worker
                .as_ref()
                .map_or(String::new(), |w| format!(" (refused by {w})"))
        );
    }
    if let Some(t) = s.act {
        let _ = writeln!(
            o,
            "\nACT {:.3} s = queued {:.3} + overhead {:.3} + exec {:.3}",
            t.act_us as f64 / 1e6,
            t.queued_us as f64 / 1e6,
            t.overhead_us as f64 / 1e6,
            t.exec_us as f64 / 1e6
        );
    }
    if let Some(first) = s.timeline.first() {
        let _ = writeln!(o, "\ntimeline:");
        for m in &s.timeline {
            let _ = writeln!(
                o,
                "  +{:>9.3} s  {}",
                m.at_us.saturating_sub(first.at_us) as f64 / 1e6,
                m.what
            );
        }
    }
    for n in &s.notes {
        let _ = writeln!(o, "\nnote: {n}");
    }
    o
}
