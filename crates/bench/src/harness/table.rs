//! The text tables of the reports: columns declared once (a header and how a row
//! shows in it), rows aligned, the first column to the left and the others to the
//! right. The JSON documents are the reports' own `Serialize` form: their field
//! names are a contract with the scripts that read them, so they stay where the
//! reports declare them.

/// One column: its header and how a row shows in it.
struct Column<'a, Row> {
    header: String,
    cell: Box<dyn Fn(&Row) -> String + 'a>,
}

/// A table of `Row`s, built column by column.
pub struct Table<'a, Row> {
    columns: Vec<Column<'a, Row>>,
}

impl<'a, Row> Default for Table<'a, Row> {
    fn default() -> Self {
        Self {
            columns: Vec::new(),
        }
    }
}

impl<'a, Row> Table<'a, Row> {
    /// A table without columns.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a column headed `header` whose cells `cell` writes.
    pub fn column(mut self, header: impl Into<String>, cell: impl Fn(&Row) -> String + 'a) -> Self {
        self.columns.push(Column {
            header: header.into(),
            cell: Box::new(cell),
        });
        self
    }

    /// The header and one line per row, aligned.
    pub fn render<'r>(&self, rows: impl IntoIterator<Item = &'r Row>) -> String
    where
        Row: 'r,
    {
        align(&self.lines(rows))
    }

    /// The header, its rule and one line per row, as a markdown table.
    pub fn markdown<'r>(&self, rows: impl IntoIterator<Item = &'r Row>) -> String
    where
        Row: 'r,
    {
        let lines = self.lines(rows);
        let row = |line: &Vec<String>| format!("| {} |\n", line.join(" | "));
        let mut out = row(&lines[0]);
        out.push_str(&format!(
            "|{}|\n",
            vec!["---"; self.columns.len()].join("|")
        ));
        out.extend(lines[1..].iter().map(row));
        out
    }

    /// The header's cells, then each row's.
    fn lines<'r>(&self, rows: impl IntoIterator<Item = &'r Row>) -> Vec<Vec<String>>
    where
        Row: 'r,
    {
        let mut lines = vec![
            self.columns
                .iter()
                .map(|column| column.header.clone())
                .collect(),
        ];
        lines.extend(rows.into_iter().map(|row| {
            self.columns
                .iter()
                .map(|column| (column.cell)(row))
                .collect()
        }));
        lines
    }
}

/// A figure with `decimals` decimals, or `-` when there is none.
pub fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.decimals$}"))
}

/// Rows of cells as aligned lines: the first column to the left, the others to
/// the right, two spaces apart.
pub fn align(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            rows.iter()
                .filter_map(|row| row.get(column))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(column, cell)| {
                if column == 0 {
                    format!("{cell:<width$}", width = widths[column])
                } else {
                    format!("{cell:>width$}", width = widths[column])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_declared_once_and_aligned() {
        let rows = [("lamina", 1000), ("qemu-nbd", 20)];
        let text = Table::new()
            .column("server", |row: &(&str, u32)| row.0.to_owned())
            .column("IOPS", |row| row.1.to_string())
            .render(&rows);
        assert_eq!(text, "server    IOPS\nlamina    1000\nqemu-nbd    20\n");
        let markdown = Table::new()
            .column("server", |row: &(&str, u32)| row.0.to_owned())
            .column("IOPS", |row| row.1.to_string())
            .markdown(&rows[..1]);
        assert_eq!(
            markdown,
            "| server | IOPS |\n|---|---|\n| lamina | 1000 |\n"
        );
    }
}
