//! Diagnostics: every problem found in a job file or a model, with where it is.
//!
//! Validation never stops at the first problem; it collects one [`Diagnostic`] per
//! problem so a user fixes a job file in one round (design §1: every bad input gets a
//! clear error).

use std::fmt;

/// One problem in a job file or model.
///
/// Displays as `file:line:col: field: message`; parts that are unknown or empty are
/// left out (a model built in memory has no file and no positions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Display name of the job file (empty when the model did not come from a file).
    pub file: String,
    /// 1-based line of the offending text, when known.
    pub line: Option<u32>,
    /// 1-based column (in characters) of the offending text, when known.
    pub column: Option<u32>,
    /// Dotted path of the offending field, e.g. `operator[1].inputs[0].from`; tables are
    /// indexed from 0 within their own kind. Empty for TOML syntax errors.
    pub field: String,
    /// What is wrong, naming the offending value.
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic without file or position.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Diagnostic {
            file: String::new(),
            line: None,
            column: None,
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut prefix = String::new();
        if !self.file.is_empty() {
            prefix.push_str(&self.file);
        }
        if let Some(line) = self.line {
            if !prefix.is_empty() {
                prefix.push(':');
            }
            prefix.push_str(&line.to_string());
            if let Some(col) = self.column {
                prefix.push(':');
                prefix.push_str(&col.to_string());
            }
        }
        if !prefix.is_empty() {
            write!(f, "{prefix}: ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found, in source order where positions are known. Never empty when
/// returned as an error.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// Whether there are no diagnostics.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of diagnostics.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Iterates the diagnostics.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }

    /// Sets `file` on every diagnostic that has none (e.g. after compiling a model that
    /// was parsed from `file`).
    pub fn with_file(mut self, file: &str) -> Self {
        for d in &mut self.0 {
            if d.file.is_empty() {
                d.file = file.to_owned();
            }
        }
        self
    }

    /// Whether some diagnostic's field is `field` or lies below it (`field.` / `field[`).
    pub fn mentions(&self, field: &str) -> bool {
        self.0.iter().any(|d| field_within(&d.field, field))
    }

    /// `Ok(())` if empty, else `Err(self)`.
    ///
    /// # Errors
    /// `self`, when it holds at least one diagnostic.
    pub fn into_result(self) -> Result<(), Diagnostics> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Self {
        Diagnostics(vec![d])
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Whether dotted field path `field` is `outer` or lies below it (`outer.…` / `outer[…`):
/// `operator[1].config.key` lies within `operator[1].config`, `operator[10]` not within
/// `operator[1`.
pub fn field_within(field: &str, outer: &str) -> bool {
    field
        .strip_prefix(outer)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_omits_missing_parts() {
        let mut d = Diagnostic::new("job.name", "is required");
        assert_eq!(d.to_string(), "job.name: is required");
        d.file = "job.toml".into();
        assert_eq!(d.to_string(), "job.toml: job.name: is required");
        d.line = Some(3);
        assert_eq!(d.to_string(), "job.toml:3: job.name: is required");
        d.column = Some(7);
        assert_eq!(d.to_string(), "job.toml:3:7: job.name: is required");
        d.field.clear();
        assert_eq!(d.to_string(), "job.toml:3:7: is required");
        let all = Diagnostics(vec![d.clone(), Diagnostic::new("x", "y")]);
        assert_eq!(all.to_string(), "job.toml:3:7: is required\nx: y");
        assert!(all.mentions("x"));
        assert!(!all.mentions("job"));
    }
}
