//! Checks a plugin's config object against the JSON Schema its `describe()` declares
//! (`config_schema`), so `nopstream validate` and planning catch a bad config before any
//! plugin is opened.
//!
//! The subset understood is the one the SDK documents for `config_schema`: `type`
//! (`object`, `array`, `string`, `integer`, `number`, `boolean`, `null`, or a list of
//! them), `properties`, `required`, `additionalProperties` (`false` or a schema), `enum`,
//! `const`, `items`, `minimum`, `maximum`, `minLength`, `maxLength`, `minItems`,
//! `maxItems`. Other keywords (`description`, `default`, `$schema`, ...) are ignored, so a
//! richer schema is checked as far as this subset goes and never refused for what it
//! cannot check.

use serde_json::Value;

/// One place where a config breaks its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaViolation {
    /// Dotted path inside the config (`window.size_ms`, `aggregates[1].fn`); empty for
    /// the config object itself.
    pub path: String,
    /// What is wrong and what is allowed, e.g. ``must be one of "csv", "jsonl", found "xml"``.
    pub message: String,
}

/// Every violation of `schema` by `value` (empty: the config conforms).
pub fn check_config(schema: &Value, value: &Value) -> Vec<SchemaViolation> {
    let mut out = Vec::new();
    check(schema, value, "", &mut out);
    out
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        other => type_name(v) == other,
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!("{}...", &s[..s.floor_char_boundary(57)])
    } else {
        s
    }
}

fn check(schema: &Value, value: &Value, path: &str, out: &mut Vec<SchemaViolation>) {
    let Some(s) = schema.as_object() else {
        return;
    };
    let mut fail = |message: String| {
        out.push(SchemaViolation {
            path: path.to_owned(),
            message,
        })
    };
    if let Some(t) = s.get("type") {
        let allowed: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !allowed.is_empty() && !allowed.iter().any(|t| is_type(value, t)) {
            fail(format!(
                "must be {}, found {} {}",
                allowed.join(" or "),
                type_name(value),
                short(value)
            ));
            return;
        }
    }
    if let Some(Value::Array(choices)) = s.get("enum")
        && !choices.contains(value)
    {
        let list: Vec<String> = choices.iter().map(short).collect();
        fail(format!(
            "must be one of {}, found {}",
            list.join(", "),
            short(value)
        ));
    }
    if let Some(c) = s.get("const")
        && c != value
    {
        fail(format!("must be {}, found {}", short(c), short(value)));
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = s.get("minimum").and_then(Value::as_f64)
            && n < min
        {
            fail(format!("must be >= {min}, found {}", short(value)));
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64)
            && n > max
        {
            fail(format!("must be <= {max}, found {}", short(value)));
        }
    }
    if let Some(text) = value.as_str() {
        let len = text.chars().count() as u64;
        if let Some(min) = s.get("minLength").and_then(Value::as_u64)
            && len < min
        {
            fail(format!(
                "must be at least {min} characters long, found {len}"
            ));
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
            && len > max
        {
            fail(format!(
                "must be at most {max} characters long, found {len}"
            ));
        }
    }
    if let Some(items) = value.as_array() {
        let len = items.len() as u64;
        if let Some(min) = s.get("minItems").and_then(Value::as_u64)
            && len < min
        {
            fail(format!("must have at least {min} items, found {len}"));
        }
        if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
            && len > max
        {
            fail(format!("must have at most {max} items, found {len}"));
        }
        if let Some(item) = s.get("items") {
            for (i, v) in items.iter().enumerate() {
                check(item, v, &format!("{path}[{i}]"), out);
            }
        }
    }
    if let Some(obj) = value.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(required)) = s.get("required") {
            for r in required.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    out.push(SchemaViolation {
                        path: path.to_owned(),
                        message: format!("missing required field `{r}`"),
                    });
                }
            }
        }
        let mut fields: Vec<(&String, &Value)> = obj.iter().collect();
        fields.sort_by_key(|(k, _)| k.as_str());
        for (k, v) in fields {
            let field = join(path, k);
            match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
                (Some(sub), _) => check(sub, v, &field, out),
                (None, Some(Value::Bool(false))) => {
                    let mut known: Vec<&str> = props
                        .map(|p| p.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    known.sort_unstable();
                    out.push(SchemaViolation {
                        path: field,
                        message: if known.is_empty() {
                            "unknown field; this config takes no fields".to_owned()
                        } else {
                            format!("unknown field; known fields: {}", known.join(", "))
                        },
                    });
                }
                (None, Some(extra @ Value::Object(_))) => check(extra, v, &field, out),
                (None, _) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(schema: Value, value: Value) -> Vec<String> {
        check_config(&schema, &value)
            .into_iter()
            .map(|v| format!("{}: {}", v.path, v.message))
            .collect()
    }

    #[test]
    fn a_conforming_config_has_no_violation() {
        let schema = json!({"type":"object","additionalProperties":false,"required":["path"],
            "properties":{"path":{"type":"string"},"splits":{"type":"integer","minimum":1},
            "format":{"enum":["csv","jsonl"]}}});
        assert!(msgs(schema, json!({"path":"/a","splits":2,"format":"csv"})).is_empty());
    }

    #[test]
    fn each_keyword_names_the_field_and_what_is_allowed() {
        let schema = json!({"type":"object","additionalProperties":false,"required":["path","aggregates"],
            "properties":{"path":{"type":"string"},"splits":{"type":"integer","minimum":1},
            "format":{"enum":["csv","jsonl"]},
            "aggregates":{"type":"array","items":{"type":"object","required":["fn"],
                "properties":{"fn":{"enum":["count","sum"]}}}}}});
        let got = msgs(
            schema,
            json!({"splits":0,"format":"xml","colour":1,"aggregates":[{"fn":"count"},{"fn":"avg"},{}]}),
        );
        assert_eq!(
            got,
            vec![
                ": missing required field `path`".to_string(),
                "aggregates[1].fn: must be one of \"count\", \"sum\", found \"avg\"".into(),
                "aggregates[2]: missing required field `fn`".into(),
                "colour: unknown field; known fields: aggregates, format, path, splits".into(),
                "format: must be one of \"csv\", \"jsonl\", found \"xml\"".into(),
                "splits: must be >= 1, found 0".into(),
            ]
        );
    }

    #[test]
    fn types_are_checked_before_anything_else() {
        let schema = json!({"type":"object","properties":{"n":{"type":"integer","minimum":5}}});
        assert_eq!(
            msgs(schema.clone(), json!({"n":"7"})),
            vec!["n: must be integer, found string \"7\"".to_string()]
        );
        assert_eq!(
            msgs(schema, json!([1])),
            vec![": must be object, found array [1]".to_string()]
        );
        assert!(msgs(json!({"type":"number"}), json!(3)).is_empty());
        assert_eq!(
            msgs(json!({"type":"integer"}), json!(2.5)),
            vec![": must be integer, found number 2.5".to_string()]
        );
    }
}
