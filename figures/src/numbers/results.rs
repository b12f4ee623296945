//! `benchmarks/results.md` read back: each `## ` section the bench commands
//! write, its prose and its tables, so that a number the guide quotes is
//! looked up by the names a reader sees there (section, row, column).

use anyhow::{anyhow, bail, Context, Result};

/// The whole results file.
pub struct Results {
    sections: Vec<Section>,
}

/// One `## ` section: everything under its heading, and its tables.
pub struct Section {
    pub title: String,
    text: String,
    tables: Vec<Table>,
}

/// One markdown table, with the `### ` heading it sits under, if any.
pub struct Table {
    heading: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// One row of a table, its cells read by column name.
pub struct Row<'a> {
    table: &'a Table,
    cells: &'a [String],
}

impl Results {
    pub fn parse(text: &str) -> Results {
        let sections = text
            .split("\n## ")
            .skip(1)
            .map(|chunk| {
                let (title, body) = chunk.split_once('\n').unwrap_or((chunk, ""));
                Section { title: title.trim().to_string(), text: body.to_string(), tables: tables(body) }
            })
            .collect();
        Results { sections }
    }

    /// The section headed `## {title}`.
    pub fn section(&self, title: &str) -> Result<&Section> {
        self.sections
            .iter()
            .find(|s| s.title == title)
            .ok_or_else(|| anyhow!("benchmarks/results.md has no section `## {title}`: run the bench that writes it"))
    }
}

/// The tables of a section, each with the `### ` heading above it.
fn tables(body: &str) -> Vec<Table> {
    let mut tables = vec![];
    let mut heading = String::new();
    let mut lines = body.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(title) = line.strip_prefix("### ") {
            heading = title.trim().to_string();
        } else if line.starts_with('|') {
            let header = cells(line);
            lines.next(); // the |---| line under the header
            let mut rows = vec![];
            while let Some(row) = lines.next_if(|l| l.starts_with('|')) {
                rows.push(cells(row));
            }
            tables.push(Table { heading: heading.clone(), header, rows });
        }
    }
    tables
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(|cell| cell.trim().to_string()).collect()
}

impl Section {
    /// The table under the `### ` heading that contains `heading`.
    pub fn table_under(&self, heading: &str) -> Result<&Table> {
        self.tables
            .iter()
            .find(|t| t.heading.contains(heading))
            .ok_or_else(|| anyhow!("section `{}` has no table under a heading with `{heading}`", self.title))
    }

    /// The table whose first column is called `column`.
    pub fn table_headed(&self, column: &str) -> Result<&Table> {
        self.tables
            .iter()
            .find(|t| t.header.first().is_some_and(|c| c == column))
            .ok_or_else(|| anyhow!("section `{}` has no table whose first column is `{column}`", self.title))
    }

    /// The machine the section says its numbers ran on: the CPU or GPU model
    /// its bench read, without trademark signs, e.g. `Intel Xeon`.
    pub fn host(&self) -> Result<String> {
        host_in(&self.text).with_context(|| format!("section `{}` names no machine", self.title))
    }

    /// The first number the section's prose writes right after `prefix`.
    pub fn number_after(&self, prefix: &str) -> Result<f64> {
        number_after(&self.prose(), prefix).with_context(|| format!("in section `{}`", self.title))
    }

    /// The first number the section's prose writes right before `suffix`.
    pub fn number_before(&self, suffix: &str) -> Result<f64> {
        number_before(&self.prose(), suffix).with_context(|| format!("in section `{}`", self.title))
    }

    /// The section's text with each run of white space one space, as a
    /// reader sees its wrapped lines.
    fn prose(&self) -> String {
        self.text.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// The makers whose model names a bench writes (`/proc/cpuinfo`'s, `nvidia-smi`'s).
const MAKERS: [&str; 4] = ["Intel", "AMD", "NVIDIA", "Apple"];

fn host_in(text: &str) -> Option<String> {
    let plain = text.replace("(R)", "").replace("(TM)", "");
    let start = MAKERS.iter().filter_map(|maker| plain.find(maker)).min()?;
    let name = plain[start..].split([',', ';', '(', ')', '\n']).next()?;
    let name = name.trim().trim_end_matches(" Processor").trim_end_matches(" CPU");
    Some(name.to_string())
}

/// The first number in `text` that follows `prefix` directly.
pub fn number_after(text: &str, prefix: &str) -> Result<f64> {
    text.match_indices(prefix)
        .find_map(|(at, _)| leading_number(&text[at + prefix.len()..]))
        .ok_or_else(|| anyhow!("no number after `{prefix}`"))
}

/// The first number in `text` that ends right before `suffix`.
pub fn number_before(text: &str, suffix: &str) -> Result<f64> {
    text.match_indices(suffix)
        .find_map(|(at, _)| {
            let start = text[..at].rfind(|c: char| !(c.is_ascii_digit() || c == '.' || c == ',')).map_or(0, |i| i + 1);
            parse(&text[start..at])
        })
        .ok_or_else(|| anyhow!("no number before `{suffix}`"))
}

/// The number a cell or a phrase starts with: `4,182 MiB` is 4182, `0.96x` is 0.96.
fn leading_number(text: &str) -> Option<f64> {
    let end = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ',')).unwrap_or(text.len());
    parse(&text[..end])
}

fn parse(number: &str) -> Option<f64> {
    number.trim_end_matches(['.', ',']).replace(',', "").parse().ok()
}

impl Table {
    /// The row whose cells in the named columns hold these values, e.g.
    /// `[("setup", "DDP, PowerSGD rank 2")]`.
    pub fn row(&self, key: &[(&str, &str)]) -> Result<Row<'_>> {
        let columns: Vec<usize> = key.iter().map(|(column, _)| self.column(column)).collect::<Result<_>>()?;
        self.rows
            .iter()
            .find(|cells| columns.iter().zip(key).all(|(&i, (_, value))| cells.get(i).is_some_and(|c| c == value)))
            .map(|cells| Row { table: self, cells })
            .ok_or_else(|| anyhow!("the table under `{}` has no row {key:?}", self.heading))
    }

    fn column(&self, name: &str) -> Result<usize> {
        self.header
            .iter()
            .position(|c| c == name)
            .ok_or_else(|| anyhow!("the table under `{}` has no column `{name}`", self.heading))
    }

    /// The first number its `### ` heading writes after `prefix` (`T 256` gives 256 after `T `).
    pub fn heading_number_after(&self, prefix: &str) -> Result<f64> {
        number_after(&self.heading, prefix).with_context(|| format!("in the heading `{}`", self.heading))
    }
}

impl Row<'_> {
    /// The number the cell in `column` starts with.
    pub fn number(&self, column: &str) -> Result<f64> {
        let cell = self.cells.get(self.table.column(column)?).map(String::as_str).unwrap_or_default();
        match leading_number(cell) {
            Some(number) => Ok(number),
            None => bail!("the `{column}` cell of row `{}` holds no number: {cell:?}", self.cells[0]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESULTS: &str = "# Benchmark results

## Training throughput

Written by `cargo xtask bench`. Host: Intel(R) Xeon(R) Processor, 2 cores; a 1024 × 1024 f32 matrix
product at 115 GFLOP/s on 1 thread, 242 on 2.

### GPT-2 124M shape (`small` config, T 256, batch 2 × 4 micro-batches per step)

| setup | threads | tokens/s | vs PyTorch |
|---|---:|---:|---:|
| workbook, DDP on 2 processes | 2 | 167 | 0.78x |
| PyTorch, single process | 2 | 1,233 |  |

## Parallelisms composed on a mesh

Written by `cargo xtask bench mesh` (3 interleaved rounds; AMD EPYC). Peaks: 67 TFLOP/s
f32, 989 bf16.

| config | N | peak memory per rank |
|---|---:|---:|
| tiny | 2 | 113 MiB |
| tiny | 4 | skipped: needs more memory |||
";

    #[test]
    fn a_cell_is_found_by_section_heading_row_and_column() {
        let results = Results::parse(RESULTS);
        let table = results.section("Training throughput").unwrap().table_under("`small` config").unwrap();
        let row = table.row(&[("setup", "workbook, DDP on 2 processes")]).unwrap();
        assert_eq!(row.number("tokens/s").unwrap(), 167.0);
        assert_eq!(row.number("vs PyTorch").unwrap(), 0.78);
        let pytorch = table.row(&[("setup", "PyTorch, single process")]).unwrap();
        assert_eq!(pytorch.number("tokens/s").unwrap(), 1233.0, "thousands separators are read");
        assert!(pytorch.number("vs PyTorch").is_err(), "an empty cell is no number");
        assert_eq!(table.heading_number_after("T ").unwrap(), 256.0);
    }

    #[test]
    fn a_row_is_found_by_several_columns_and_a_short_row_is_no_number() {
        let results = Results::parse(RESULTS);
        let table = results.section("Parallelisms composed on a mesh").unwrap().table_headed("config").unwrap();
        let row = table.row(&[("config", "tiny"), ("N", "2")]).unwrap();
        assert_eq!(row.number("peak memory per rank").unwrap(), 113.0);
        let skipped = table.row(&[("config", "tiny"), ("N", "4")]).unwrap();
        assert!(skipped.number("peak memory per rank").is_err());
    }

    #[test]
    fn the_host_is_the_model_name_without_trademark_signs() {
        let results = Results::parse(RESULTS);
        assert_eq!(results.section("Training throughput").unwrap().host().unwrap(), "Intel Xeon");
        assert_eq!(results.section("Parallelisms composed on a mesh").unwrap().host().unwrap(), "AMD EPYC");
        let gpu = "Written by `scripts/gpu-check.sh run` on one NVIDIA H100 80GB HBM3 (16 cores, driver 580)";
        assert_eq!(host_in(gpu).unwrap(), "NVIDIA H100 80GB HBM3");
    }

    #[test]
    fn numbers_are_read_from_prose_around_a_phrase() {
        let results = Results::parse(RESULTS);
        let throughput = results.section("Training throughput").unwrap();
        assert_eq!(throughput.number_after("product at ").unwrap(), 115.0);
        let mesh = results.section("Parallelisms composed on a mesh").unwrap();
        assert_eq!(mesh.number_before(" TFLOP/s f32").unwrap(), 67.0, "a line break reads as a space");
        assert_eq!(mesh.number_before(" bf16.").unwrap(), 989.0);
        assert!(mesh.number_after("Host: ").is_err());
    }

    #[test]
    fn a_missing_section_row_or_column_says_which() {
        let results = Results::parse(RESULTS);
        let error = results.section("Edit → verdict").err().unwrap().to_string();
        assert!(error.contains("no section `## Edit → verdict`"), "{error}");
        let table = results.section("Training throughput").unwrap().table_under("`small`").unwrap();
        let error = table.row(&[("setup", "workbook, FSDP")]).err().unwrap().to_string();
        assert!(error.contains("no row") && error.contains("workbook, FSDP"), "{error}");
        let error = table.row(&[("ranks", "2")]).err().unwrap().to_string();
        assert!(error.contains("no column `ranks`"), "{error}");
    }
}
