//! [`CsvDataset`]: a CSV file of numeric columns and a label column, read a row at a
//! time. Opening the file reads it once, checking every row and keeping only where
//! each row starts and its label; an example is parsed from the file when asked for,
//! so memory does not grow with the number of columns.

use crate::dataset::{check_index, Dataset, Example, Field};
use kiln_tensor::{Error, Result};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// The longest row read, in bytes.
pub const MAX_ROW_BYTES: usize = 1 << 20;

/// A column, by its header name or its 0-based position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Column {
    /// The column whose header is this name.
    Name(String),
    /// The column at this position (0 first).
    Index(usize),
}

/// What the label column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelKind {
    /// Classes: whole numbers from 0 are used as they are; any other labels are
    /// names, numbered in sorted order ([`CsvDataset::classes`]). The target is an
    /// `i32` scalar.
    Class,
    /// A number to regress: the target is `f32`, dims `[1]`.
    Value,
}

/// How a CSV file is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvConfig {
    /// The label column.
    pub label: Column,
    /// What it holds.
    pub kind: LabelKind,
    /// The feature columns, in this order; `None` for every column but the label.
    pub features: Option<Vec<Column>>,
    /// The field separator.
    pub delimiter: u8,
    /// Whether the first line names the columns.
    pub header: bool,
}

impl CsvConfig {
    /// A file with a header, comma-separated, classes in the column named `label`,
    /// every other column a feature.
    pub fn classes_in(label: &str) -> Self {
        CsvConfig {
            label: Column::Name(label.to_string()),
            kind: LabelKind::Class,
            features: None,
            delimiter: b',',
            header: true,
        }
    }
}

/// A CSV file as a dataset: each row an example, its features an `f32` vector and its
/// label the target. Opening refuses a file with a row that does not parse, naming the
/// file, the line and the column.
#[derive(Debug)]
pub struct CsvDataset {
    path: PathBuf,
    file: File,
    /// Each row's byte offset, length and line number.
    rows: Vec<(u64, usize, usize)>,
    delimiter: u8,
    feature_columns: Vec<usize>,
    feature_names: Vec<String>,
    label_column: usize,
    targets: Targets,
}

#[derive(Debug)]
enum Targets {
    Classes {
        labels: Vec<i32>,
        names: Vec<String>,
    },
    Values(Vec<f32>),
}

impl CsvDataset {
    /// Opens and checks the file at `path`.
    pub fn open(path: impl AsRef<Path>, config: &CsvConfig) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let bad = |msg: String| Error::Format(format!("{}: {msg}", path.display()));
        let file = File::open(&path).map_err(|e| bad(format!("cannot open it: {e}")))?;
        let mut reader = BufReader::new(file.try_clone().map_err(|e| bad(e.to_string()))?);
        let mut offset = 0u64;
        let mut line_no = 0usize;
        let mut line = Vec::new();
        let mut header: Option<Vec<String>> = None;
        let mut width = None;
        let mut rows = Vec::new();
        let mut labels_text = Vec::new();
        let mut columns: Option<(usize, Vec<usize>)> = None;
        loop {
            line.clear();
            let n = std::io::Read::take(&mut reader, MAX_ROW_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| bad(format!("cannot read it: {e}")))?;
            if n == 0 {
                break;
            }
            line_no += 1;
            let start = offset;
            offset += n as u64;
            if n > MAX_ROW_BYTES {
                return Err(bad(format!(
                    "line {line_no} is longer than {MAX_ROW_BYTES} bytes"
                )));
            }
            let text = std::str::from_utf8(&line)
                .map_err(|_| bad(format!("line {line_no} is not UTF-8 text")))?;
            let text = text.trim_end_matches(['\n', '\r']);
            if text.trim().is_empty() {
                continue;
            }
            let fields = split(text, config.delimiter);
            match width {
                None => width = Some(fields.len()),
                Some(w) if w != fields.len() => {
                    return Err(bad(format!(
                        "line {line_no} has {} columns where the first line has {w}",
                        fields.len()
                    )))
                }
                Some(_) => {}
            }
            if config.header && header.is_none() {
                header = Some(fields.iter().map(|s| s.to_string()).collect());
                continue;
            }
            let (label, features) = match &columns {
                Some(c) => c.clone(),
                None => {
                    let c = pick_columns(config, header.as_deref(), fields.len()).map_err(&bad)?;
                    columns = Some(c.clone());
                    c
                }
            };
            for &c in &features {
                parse_number(fields[c]).map_err(|why| {
                    bad(format!(
                        "line {line_no}, column {}: `{}` {why}",
                        column_name(header.as_deref(), c),
                        fields[c]
                    ))
                })?;
            }
            labels_text.push((fields[label].trim().to_string(), line_no));
            rows.push((start, n, line_no));
        }
        let Some((label_column, feature_columns)) = columns else {
            return Err(bad("it has no rows of data".into()));
        };
        let targets = match config.kind {
            LabelKind::Class => class_targets(&labels_text).map_err(bad)?,
            LabelKind::Value => Targets::Values(
                labels_text
                    .iter()
                    .map(|(t, line)| {
                        parse_number(t).map_err(|why| {
                            bad(format!(
                                "line {line}, label column {}: `{t}` {why}",
                                column_name(header.as_deref(), label_column)
                            ))
                        })
                    })
                    .collect::<Result<_>>()?,
            ),
        };
        let feature_names = feature_columns
            .iter()
            .map(|&c| column_name(header.as_deref(), c))
            .collect();
        Ok(CsvDataset {
            path,
            file,
            rows,
            delimiter: config.delimiter,
            feature_columns,
            feature_names,
            label_column,
            targets,
        })
    }

    /// The class names, numbered in this order (empty for whole-number classes and
    /// for values).
    pub fn classes(&self) -> &[String] {
        match &self.targets {
            Targets::Classes { names, .. } => names,
            Targets::Values(_) => &[],
        }
    }

    /// How many classes: the largest class number plus one (0 for values).
    pub fn num_classes(&self) -> usize {
        match &self.targets {
            Targets::Classes { labels, .. } => labels.iter().max().map_or(0, |&m| m as usize + 1),
            Targets::Values(_) => 0,
        }
    }

    /// The feature columns' names (their positions where the file has no header).
    pub fn feature_names(&self) -> &[String] {
        &self.feature_names
    }

    /// The label column's position.
    pub fn label_column(&self) -> usize {
        self.label_column
    }

    /// Row `index`'s text, read from the file.
    fn row_text(&self, index: usize) -> Result<String> {
        let (offset, len, line) = self.rows[index];
        let mut buf = vec![0u8; len];
        read_exact_at(&self.file, &mut buf, offset).map_err(|e| {
            Error::Format(format!(
                "{}: cannot read line {line} again: {e}",
                self.path.display()
            ))
        })?;
        String::from_utf8(buf).map_err(|_| {
            Error::Format(format!(
                "{}: line {line} changed since the file was opened",
                self.path.display()
            ))
        })
    }
}

impl Dataset for CsvDataset {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn get(&self, index: usize) -> Result<Example> {
        check_index("CsvDataset", index, self.rows.len())?;
        let text = self.row_text(index)?;
        let fields = split(text.trim_end_matches(['\n', '\r']), self.delimiter);
        let line = self.rows[index].2;
        let changed = || {
            Error::Format(format!(
                "{}: line {line} changed since the file was opened",
                self.path.display()
            ))
        };
        let features = self
            .feature_columns
            .iter()
            .map(|&c| {
                fields
                    .get(c)
                    .and_then(|f| parse_number(f).ok())
                    .ok_or_else(changed)
            })
            .collect::<Result<Vec<f32>>>()?;
        let target = match &self.targets {
            Targets::Classes { labels, .. } => Field::class(labels[index]),
            Targets::Values(v) => Field::features(vec![v[index]]),
        };
        Ok(Example {
            input: Field::features(features),
            target,
        })
    }
}

/// A row's fields, each trimmed and unquoted.
fn split(text: &str, delimiter: u8) -> Vec<&str> {
    text.split(delimiter as char)
        .map(|f| {
            let f = f.trim();
            f.strip_prefix('"')
                .and_then(|f| f.strip_suffix('"'))
                .unwrap_or(f)
        })
        .collect()
}

fn parse_number(text: &str) -> std::result::Result<f32, &'static str> {
    if text.is_empty() {
        return Err("is empty (a missing value)");
    }
    let v: f32 = text.parse().map_err(|_| "is not a number")?;
    if !v.is_finite() {
        return Err("is not a finite number");
    }
    Ok(v)
}

fn column_name(header: Option<&[String]>, c: usize) -> String {
    match header {
        Some(h) => format!("`{}`", h[c]),
        None => c.to_string(),
    }
}

/// The label column and the feature columns, from the config and the header.
fn pick_columns(
    config: &CsvConfig,
    header: Option<&[String]>,
    width: usize,
) -> std::result::Result<(usize, Vec<usize>), String> {
    let find = |c: &Column| -> std::result::Result<usize, String> {
        match c {
            Column::Index(i) if *i < width => Ok(*i),
            Column::Index(i) => Err(format!("it has {width} columns, no column {i}")),
            Column::Name(name) => {
                let Some(h) = header else {
                    return Err(format!(
                        "column `{name}` is asked for by name but the file is read without a header"
                    ));
                };
                h.iter().position(|n| n == name).ok_or_else(|| {
                    format!("it has no column `{name}` (its columns: {})", h.join(", "))
                })
            }
        }
    };
    let label = find(&config.label)?;
    let features = match &config.features {
        Some(cols) => cols
            .iter()
            .map(find)
            .collect::<std::result::Result<Vec<_>, _>>()?,
        None => (0..width).filter(|&c| c != label).collect(),
    };
    if features.contains(&label) {
        return Err("the label column is also a feature".into());
    }
    if features.is_empty() {
        return Err("it has no feature columns besides the label".into());
    }
    Ok((label, features))
}

fn class_targets(labels: &[(String, usize)]) -> std::result::Result<Targets, String> {
    let numbers: Option<Vec<i32>> = labels.iter().map(|(t, _)| t.parse::<i32>().ok()).collect();
    if let Some(numbers) = numbers.filter(|n| n.iter().all(|&v| v >= 0)) {
        return Ok(Targets::Classes {
            labels: numbers,
            names: Vec::new(),
        });
    }
    if let Some((_, line)) = labels.iter().find(|(t, _)| t.is_empty()) {
        return Err(format!("line {line} has an empty label"));
    }
    let names: Vec<String> = labels
        .iter()
        .map(|(t, _)| t.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let labels = labels
        .iter()
        .map(|(t, _)| names.binary_search(t).expect("every label is a name") as i32)
        .collect();
    Ok(Targets::Classes { labels, names })
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}
