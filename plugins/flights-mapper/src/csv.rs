//! Splitting one CSV line into fields without allocating per field.
//!
//! RFC 4180 within a single line: fields are separated by `,`; a field starting with `"`
//! is quoted, runs to the matching closing `"`, and `""` inside it stands for one `"`.
//! Records spanning lines (newlines inside quotes) are not supported — the source hands
//! over one line at a time.

/// One field of a line: a byte range of the line plus how to read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// Start of the field's content (after an opening quote).
    pub start: usize,
    /// End of the field's content (before a closing quote).
    pub end: usize,
    /// The field was quoted (so `NA` inside it is the string "NA", not a missing value).
    pub quoted: bool,
    /// The content holds `""` escapes that stand for `"`.
    pub escaped: bool,
}

impl Field {
    /// The raw content bytes (escapes not undone).
    #[must_use]
    pub fn raw<'a>(&self, line: &'a [u8]) -> &'a [u8] {
        &line[self.start..self.end]
    }
}

/// Splits `line` into `fields` (cleared first).
///
/// # Errors
/// A quoted field is not closed, or a closing quote is followed by something other than
/// `,` or the end of the line; the message names the 0-based field index.
pub fn split_line(line: &[u8], fields: &mut Vec<Field>) -> Result<(), String> {
    fields.clear();
    let mut i = 0;
    loop {
        if line.get(i) == Some(&b'"') {
            let start = i + 1;
            let mut j = start;
            let mut escaped = false;
            loop {
                match line.get(j) {
                    None => {
                        return Err(format!("field {} has an unterminated quote", fields.len()));
                    }
                    Some(b'"') if line.get(j + 1) == Some(&b'"') => {
                        escaped = true;
                        j += 2;
                    }
                    Some(b'"') => break,
                    Some(_) => j += 1,
                }
            }
            fields.push(Field {
                start,
                end: j,
                quoted: true,
                escaped,
            });
            match line.get(j + 1) {
                None => return Ok(()),
                Some(b',') => i = j + 2,
                Some(_) => {
                    return Err(format!(
                        "field {} has text after its closing quote",
                        fields.len() - 1
                    ));
                }
            }
        } else {
            let end = line[i..]
                .iter()
                .position(|b| *b == b',')
                .map_or(line.len(), |p| i + p);
            fields.push(Field {
                start: i,
                end,
                quoted: false,
                escaped: false,
            });
            if end == line.len() {
                return Ok(());
            }
            i = end + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(line: &str) -> Result<Vec<(String, bool)>, String> {
        let mut fields = Vec::new();
        split_line(line.as_bytes(), &mut fields)?;
        Ok(fields
            .iter()
            .map(|f| {
                let raw = String::from_utf8(f.raw(line.as_bytes()).to_vec()).unwrap();
                let text = if f.escaped {
                    raw.replace("\"\"", "\"")
                } else {
                    raw
                };
                (text, f.quoted)
            })
            .collect())
    }

    #[test]
    fn splits_plain_and_quoted_fields() {
        let s = |t: &str, q| (t.to_string(), q);
        assert_eq!(
            texts(r#"2013,"UA",,NA,"a,b","say ""hi""","""#).unwrap(),
            vec![
                s("2013", false),
                s("UA", true),
                s("", false),
                s("NA", false),
                s("a,b", true),
                s(r#"say "hi""#, true),
                s("", true),
            ]
        );
        assert_eq!(texts("").unwrap(), vec![s("", false)]);
        assert_eq!(texts("a,").unwrap(), vec![s("a", false), s("", false)]);
    }

    #[test]
    fn rejects_broken_quotes() {
        assert!(texts(r#"1,"abc"#).unwrap_err().contains("field 1"));
        assert!(texts(r#""ab"c,1"#).unwrap_err().contains("field 0"));
    }
}
