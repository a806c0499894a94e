//! The CLI's text tables, through comfy-table: each column as wide as its widest cell, so a
//! long worker id or image name widens its column instead of pushing the row out of line.
//! No borders, two spaces between columns, no trailing spaces; the first column (a name) is
//! left-aligned and the others (numbers) right-aligned unless [`left`] says otherwise.

use comfy_table::{presets::NOTHING, CellAlignment, ContentArrangement, Table};

/// A table with this header row.
pub(crate) fn new<const N: usize>(header: [&str; N]) -> Table {
    let mut t = Table::new();
    t.load_preset(NOTHING)
        // Never wrapped to a terminal's width: a pipe or a log keeps whole rows.
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header);
    for (i, c) in t.column_iter_mut().enumerate() {
        c.set_padding((0, if i + 1 < N { 2 } else { 0 }));
        c.set_cell_alignment(if i == 0 {
            CellAlignment::Left
        } else {
            CellAlignment::Right
        });
    }
    t
}

/// Left-aligns these columns (text rather than numbers).
pub(crate) fn left(t: &mut Table, columns: &[usize]) {
    for &i in columns {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Left);
        }
    }
}

/// Right-aligns these columns (a number in the first column).
pub(crate) fn right(t: &mut Table, columns: &[usize]) {
    for &i in columns {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// The table as lines, each prefixed by `indent`, without trailing spaces, ending in a
/// newline.
pub(crate) fn render(t: &Table, indent: &str) -> String {
    t.lines()
        .map(|l| format!("{indent}{}\n", l.trim_end()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_cell_widens_its_column_and_every_row_stays_aligned() {
        let mut t = new(["worker", "cores", "state"]);
        left(&mut t, &[2]);
        t.add_row(["a", "1 / 4", "ok"]);
        t.add_row([
            "a-very-long-worker-id-from-a-fleet-0123456789",
            "12 / 64",
            "draining",
        ]);
        let text = render(&t, "  ");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        // The text column starts at one place on every line.
        let third: Vec<usize> = ["state", "ok", "draining"]
            .iter()
            .zip(&lines)
            .map(|(w, l)| l.rfind(w).unwrap())
            .collect();
        assert!(third.windows(2).all(|w| w[0] == w[1]), "{text}");
        assert!(
            lines
                .iter()
                .all(|l| l.starts_with("  ") && !l.ends_with(' ')),
            "{text}"
        );
        assert!(
            lines[2].starts_with("  a-very-long-worker-id-from-a-fleet-0123456789  "),
            "{text}"
        );
        // Numbers are right-aligned: the cores cells end in one column.
        let cores_end: Vec<usize> = [("cores", 0), ("1 / 4", 1), ("12 / 64", 2)]
            .iter()
            .map(|(w, i)| lines[*i].find(w).unwrap() + w.len())
            .collect();
        assert!(cores_end.windows(2).all(|w| w[0] == w[1]), "{text}");
    }
}
