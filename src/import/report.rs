//! The import report: every item of the source that was not converted, or converted with
//! different semantics, with the file and line (or YAML document and annotation) it came from.
//! Printed on stderr; `--strict` fails when it holds anything but notes.

use std::fmt;

/// How much of an item reached the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Not in the output: Tollgate has no equivalent, or the value could not be read.
    LeftOut,
    /// In the output, with semantics that differ (named in the message).
    Approximated,
    /// Nothing lost: said for the record (a manifest that is not an Ingress, a value a browser
    /// caps anyway). Does not fail `--strict`.
    Note,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::LeftOut => "left out",
            Severity::Approximated => "approximated",
            Severity::Note => "note",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub severity: Severity,
    /// The source file.
    pub file: String,
    /// The line in it, when known.
    pub line: Option<usize>,
    /// Where in the file: `document 2, Ingress default/api, annotation …`, or a directive.
    pub place: String,
    pub message: String,
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: ", self.file)?,
            None => write!(f, "{}: ", self.file)?,
        }
        write!(
            f,
            "{}: {}: {}",
            self.severity.as_str(),
            self.place,
            self.message
        )
    }
}

/// Everything an import could not carry over as it was.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub items: Vec<Item>,
}

impl Report {
    /// Adds one item.
    pub fn add(
        &mut self,
        severity: Severity,
        file: &str,
        line: Option<usize>,
        place: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.items.push(Item {
            severity,
            file: file.to_owned(),
            line,
            place: place.into(),
            message: message.into(),
        });
    }

    /// Items that fail `--strict`: everything but notes.
    pub fn lossy(&self) -> usize {
        self.items
            .iter()
            .filter(|i| i.severity != Severity::Note)
            .count()
    }
}
