//! Label and field selectors, parsed and matched as `k8s.io/apimachinery` does
//! (`pkg/labels/selector.go` and `pkg/fields/selector.go`).
//!
//! Label selectors support `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`,
//! `k>5` and `k<5`, joined by commas. Field selectors support `f=v`, `f==v` and `f!=v`, with
//! `\`, `,` and `=` in values escaped by a backslash.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

use crate::registry::validation::{is_label_value, is_qualified_name};

/// Why a selector could not be parsed or built. Messages follow upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label selector string that breaks the grammar.
    #[error("{0}")]
    Syntax(String),
    /// A requirement of a label selector string that could not be parsed.
    #[error("unable to parse requirement: {0}")]
    Requirement(Box<SelectorError>),
    /// A label key that is not a qualified name.
    #[error("invalid label key {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },
    /// A value that is not a valid label value.
    #[error("invalid label value: {value:?}: at key: {key:?}: {reason}")]
    InvalidValue { key: String, value: String, reason: String },
    /// Values that do not suit the operator (their number, or integers for `>` and `<`).
    #[error("{0}")]
    InvalidValues(&'static str),
    /// A field selector term without `=`, `==` or `!=`.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    FieldTerm { selector: String, term: String },
    /// A backslash in a field selector value not followed by `\`, `,` or `=`.
    #[error("invalid field selector: invalid escape sequence: {0}")]
    InvalidEscape(String),
    /// A `,` or `=` in a field selector value that is not escaped.
    #[error("invalid field selector: unescaped character in value: {0:?}")]
    UnescapedChar(char),
}

fn syntax(message: String) -> SelectorError {
    SelectorError::Syntax(message)
}

fn validate_key(key: &str) -> Result<(), SelectorError> {
    let errs = is_qualified_name(key);
    if errs.is_empty() {
        return Ok(());
    }
    Err(SelectorError::InvalidKey { key: key.to_string(), reason: errs.join("; ") })
}

fn validate_value(key: &str, value: &str) -> Result<(), SelectorError> {
    let errs = is_label_value(value);
    if errs.is_empty() {
        return Ok(());
    }
    Err(SelectorError::InvalidValue { key: key.to_string(), value: value.to_string(), reason: errs.join("; ") })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One condition on one label key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement with upstream's `NewRequirement` checks.
    fn new(key: String, op: Operator, values: Vec<String>) -> Result<Self, SelectorError> {
        use Operator::*;
        validate_key(&key)?;
        let invalid = match op {
            In | NotIn if values.is_empty() => Some("for 'in', 'notin' operators, values set can't be empty"),
            Equals | DoubleEquals | NotEquals if values.len() != 1 => {
                Some("exact-match compatibility requires one single value")
            }
            Exists | DoesNotExist if !values.is_empty() => {
                Some("values set must be empty for exists and does not exist")
            }
            GreaterThan | LessThan if values.len() != 1 => {
                Some("for 'Gt', 'Lt' operators, exactly one value is required")
            }
            GreaterThan | LessThan if values.iter().any(|v| v.parse::<i64>().is_err()) => {
                Some("for 'Gt', 'Lt' operators, the value must be an integer")
            }
            _ => None,
        };
        if let Some(message) = invalid {
            return Err(SelectorError::InvalidValues(message));
        }
        for value in &values {
            validate_value(&key, value)?;
        }
        Ok(Self { key, op, values })
    }

    fn has_value(&self, value: &str) -> bool {
        self.values.iter().any(|v| v == value)
    }

    fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        use Operator::*;
        let label = labels.and_then(|l| l.get(&self.key)).and_then(Value::as_str);
        match self.op {
            Equals | DoubleEquals | In => label.is_some_and(|v| self.has_value(v)),
            NotEquals | NotIn => !label.is_some_and(|v| self.has_value(v)),
            Exists => label.is_some(),
            DoesNotExist => label.is_none(),
            GreaterThan | LessThan => {
                let (Some(Ok(label)), [bound]) = (label.map(str::parse::<i64>), self.values.as_slice()) else {
                    return false;
                };
                let Ok(bound) = bound.parse::<i64>() else {
                    return false;
                };
                if self.op == GreaterThan { label > bound } else { label < bound }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Operator::*;
        if self.op == DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.op {
            Exists | DoesNotExist => return Ok(()),
            Equals => "=",
            DoubleEquals => "==",
            NotEquals => "!=",
            In => " in (",
            NotIn => " notin (",
            GreaterThan => ">",
            LessThan => "<",
        };
        let mut values: Vec<&str> = self.values.iter().map(String::as_str).collect();
        values.sort_unstable();
        write!(f, "{op}{}", values.join(","))?;
        if matches!(self.op, In | NotIn) {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// A label selector: the AND of its requirements, kept sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the string form used by `?labelSelector=` and `kubectl -l`.
    /// The empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut parser = Parser { items: lex(s), pos: 0 };
        Ok(Self::sorted(parser.parse()?))
    }

    /// True when the selector does not restrict anything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Matches an object's `metadata.labels`; `None` means the object has no labels.
    /// Entries whose value is not a string are not labels and count as absent.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    fn sorted(mut requirements: Vec<Requirement>) -> Self {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Self { requirements }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    End,
    Identifier,
    In,
    NotIn,
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    OpenParen,
    CloseParen,
    Comma,
}

impl Token {
    fn of(literal: &str) -> Self {
        match literal {
            "in" => Token::In,
            "notin" => Token::NotIn,
            "!" => Token::Not,
            "=" => Token::Equals,
            "==" => Token::DoubleEquals,
            "!=" => Token::NotEquals,
            ">" => Token::GreaterThan,
            "<" => Token::LessThan,
            "(" => Token::OpenParen,
            ")" => Token::CloseParen,
            "," => Token::Comma,
            _ => Token::Identifier,
        }
    }
}

fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// Splits a label selector into tokens, ending with `Token::End`.
fn lex(s: &str) -> Vec<(Token, &str)> {
    let mut items = Vec::new();
    let mut rest = s.trim_start_matches(is_whitespace);
    while let Some(c) = rest.chars().next() {
        let len = if !is_special(c) {
            rest.find(|c| is_special(c) || is_whitespace(c)).unwrap_or(rest.len())
        } else if rest.starts_with("!=") || rest.starts_with("==") {
            2
        } else {
            1
        };
        let (literal, tail) = rest.split_at(len);
        items.push((Token::of(literal), literal));
        rest = tail.trim_start_matches(is_whitespace);
    }
    items.push((Token::End, ""));
    items
}

/// Recursive-descent parser over the tokens, mirroring upstream's.
struct Parser<'a> {
    items: Vec<(Token, &'a str)>,
    pos: usize,
}

impl<'a> Parser<'a> {
    /// The next token as an operator: `in` and `notin` are keywords.
    fn peek_operator(&self) -> (Token, &'a str) {
        self.items.get(self.pos).copied().unwrap_or((Token::End, ""))
    }

    /// The next token as a key or value: `in` and `notin` are identifiers.
    fn peek(&self) -> (Token, &'a str) {
        match self.peek_operator() {
            (Token::In | Token::NotIn, literal) => (Token::Identifier, literal),
            item => item,
        }
    }

    fn next(&mut self) -> (Token, &'a str) {
        let item = self.peek();
        self.pos += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            match self.peek() {
                (Token::End, _) => return Ok(requirements),
                (Token::Identifier | Token::Not, _) => {}
                (_, lit) => {
                    return Err(syntax(format!("found '{lit}', expected: !, identifier, or 'end of string'")));
                }
            }
            let requirement = self.requirement().map_err(|e| SelectorError::Requirement(Box::new(e)))?;
            requirements.push(requirement);
            match self.next() {
                (Token::End, _) => return Ok(requirements),
                (Token::Comma, _) => {
                    let (tok, lit) = self.peek();
                    if !matches!(tok, Token::Identifier | Token::Not) {
                        return Err(syntax(format!("found '{lit}', expected: identifier after ','")));
                    }
                }
                (_, lit) => {
                    return Err(syntax(format!("found '{lit}', expected: ',' or 'end of string'")));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let negated = self.peek().0 == Token::Not;
        if negated {
            self.next();
        }
        let (tok, key) = self.next();
        if tok != Token::Identifier {
            return Err(syntax(format!("found '{key}', expected: identifier")));
        }
        validate_key(key)?;
        let key = key.to_string();
        if negated {
            return Requirement::new(key, Operator::DoesNotExist, Vec::new());
        }
        if matches!(self.peek().0, Token::End | Token::Comma) {
            return Requirement::new(key, Operator::Exists, Vec::new());
        }
        let (tok, lit) = self.peek_operator();
        self.pos += 1;
        let op = match tok {
            Token::In => Operator::In,
            Token::NotIn => Operator::NotIn,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::NotEquals => Operator::NotEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            _ => {
                return Err(syntax(format!("found '{lit}', expected: '=', '!=', '==', 'in', 'notin', '>', '<'")));
            }
        };
        let values = match op {
            Operator::In | Operator::NotIn => self.value_set()?,
            _ => self.exact_value()?,
        };
        Requirement::new(key, op, values)
    }

    /// Parses `(a,b,...)`; empty entries, as in `()` or `(a,,b)`, are the empty value.
    fn value_set(&mut self) -> Result<Vec<String>, SelectorError> {
        let (tok, lit) = self.next();
        if tok != Token::OpenParen {
            return Err(syntax(format!("found '{lit}', expected: '('")));
        }
        let mut values = BTreeSet::new();
        match self.peek() {
            (Token::CloseParen, _) => {
                values.insert("");
            }
            (Token::Identifier | Token::Comma, _) => self.values(&mut values)?,
            (_, lit) => {
                return Err(syntax(format!("found '{lit}', expected: ',', ')' or identifier")));
            }
        }
        self.next(); // the ')' that `values` stopped at
        Ok(values.into_iter().map(str::to_string).collect())
    }

    /// Collects comma-separated, possibly empty values up to (not including) `)`.
    fn values(&mut self, values: &mut BTreeSet<&'a str>) -> Result<(), SelectorError> {
        loop {
            match self.next() {
                (Token::Identifier, value) => {
                    values.insert(value);
                    match self.peek() {
                        (Token::Comma, _) => {}
                        (Token::CloseParen, _) => return Ok(()),
                        (_, lit) => {
                            return Err(syntax(format!("found '{lit}', expected: ',' or ')'")));
                        }
                    }
                }
                (Token::Comma, _) => {
                    if values.is_empty() {
                        values.insert("");
                    }
                    match self.peek().0 {
                        Token::CloseParen => {
                            values.insert("");
                            return Ok(());
                        }
                        Token::Comma => {
                            values.insert("");
                        }
                        _ => {}
                    }
                }
                (_, lit) => {
                    return Err(syntax(format!("found '{lit}', expected: ',', or identifier")));
                }
            }
        }
    }

    /// Parses the single value after `=`, `==`, `!=`, `>` or `<`; nothing is the empty value.
    fn exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        match self.peek() {
            (Token::End | Token::Comma, _) => Ok(vec![String::new()]),
            (Token::Identifier, value) => {
                self.next();
                Ok(vec![value.to_string()])
            }
            (_, lit) => Err(syntax(format!("found '{lit}', expected: identifier"))),
        }
    }
}

/// One `field=value` or `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: String,
    value: String,
    equal: bool,
}

/// A field selector: the AND of its terms, kept sorted as upstream sorts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// Parses the string form used by `?fieldSelector=` and `kubectl --field-selector`.
    /// The empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(s);
        parts.sort_unstable();
        let terms = parts
            .into_iter()
            .filter(|part| !part.is_empty())
            .map(|part| {
                let (field, op, raw) = split_term(part)
                    .ok_or_else(|| SelectorError::FieldTerm { selector: s.to_string(), term: part.to_string() })?;
                Ok(FieldTerm { field: field.to_string(), value: unescape(raw)?, equal: op != "!=" })
            })
            .collect::<Result<_, SelectorError>>()?;
        Ok(Self { terms })
    }

    /// True when the selector does not restrict anything.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Field names used, so a caller can reject unsupported fields with upstream's message.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.terms.iter().map(|t| t.field.as_str())
    }

    /// Matches an object whose value for a field is `lookup(field)`; `None` counts as the empty
    /// string, as upstream's field sets do.
    pub fn matches(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        self.terms.iter().all(|t| (lookup(&t.field).as_deref().unwrap_or("") == t.value) == t.equal)
    }

    /// The value `field` must equal, when a term such as `metadata.name=foo` requires one.
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.terms.iter().find(|t| t.equal && t.field == field).map(|t| t.value.as_str())
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = if t.equal { "=" } else { "!=" };
            write!(f, "{}{op}{}", t.field, escape(&t.value))?;
        }
        Ok(())
    }
}

/// Splits at commas that are not escaped, keeping escapes in the terms.
fn split_terms(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    terms
}

/// Splits a term at its first operator into field, operator and raw (escaped) value.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    term.char_indices().find_map(|(i, _)| {
        let rest = &term[i..];
        ["!=", "==", "="].into_iter().find(|op| rest.starts_with(op)).map(|op| (&term[..i], op, &rest[op.len()..]))
    })
}

fn unescape(raw: &str) -> Result<String, SelectorError> {
    let mut value = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => value.push(e),
                Some(e) => return Err(SelectorError::InvalidEscape(format!("\\{e}"))),
                None => return Err(SelectorError::InvalidEscape("\\".to_string())),
            },
            ',' | '=' => return Err(SelectorError::UnescapedChar(c)),
            _ => value.push(c),
        }
    }
    Ok(value)
}

fn escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn matches(selector: &str, set: Value) -> bool {
        match LabelSelector::parse(selector) {
            Ok(s) => s.matches(Some(&labels(set))),
            Err(e) => panic!("{selector}: {e}"),
        }
    }

    fn label_err(selector: &str) -> String {
        match LabelSelector::parse(selector) {
            Ok(s) => panic!("{selector}: parsed as {s}"),
            Err(e) => e.to_string(),
        }
    }

    fn canonical(selector: &str) -> String {
        match LabelSelector::parse(selector) {
            Ok(s) => s.to_string(),
            Err(e) => panic!("{selector}: {e}"),
        }
    }

    #[test]
    fn parses_and_restrings() {
        for s in ["x=a,y=b,z=c", "", "x!=a,y=b", "x=", "x= ", "x=,z= ", "x= ,z= ", "!x", "x>1", "x>1,z<5", "x==a"] {
            assert_eq!(canonical(s), s.replace(' ', ""), "{s}");
        }
    }

    #[test]
    fn set_based_syntax() {
        for (input, want) in [
            ("\rx", "x"),
            ("a ", "a"),
            ("this-is-a-dns.domain.com/key-with-dash", "this-is-a-dns.domain.com/key-with-dash"),
            ("k8s.io/app in (so,what)", "k8s.io/app in (so,what)"),
            (
                "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
                "0.1.2.domain/99 notin (10.10.100.1,tick.tack.clock)",
            ),
            ("foo  in\t (abc)", "foo in (abc)"),
            ("x notin\n (abc)", "x notin (abc)"),
            ("x in (def,abc,def)", "x in (abc,def)"),
            ("x in (abc,)", "x in (,abc)"),
            ("x in (,abc)", "x in (,abc)"),
            ("x in (a,,b)", "x in (,a,b)"),
            ("x in (a,,)", "x in (,a)"),
            ("x in ()", "x in ()"),
            ("x notin ( )", "x notin ()"),
            ("x notin (abc,,def),bar,z in (),w", "bar,w,x notin (,abc,def),z in ()"),
            ("a in (x,y,notin, z,in)", "a in (in,notin,x,y,z)"),
            ("in in (in),notin=notin", "in in (in),notin=notin"),
            ("x=a,a=x", "a=x,x=a"),
            ("z!=a,z", "z!=a,z"),
        ] {
            assert_eq!(canonical(input), want, "{input}");
        }
    }

    #[test]
    fn syntax_errors() {
        for (input, want) in [
            ("x=a||y=b", "invalid label value: \"a||y\": at key: \"x\""),
            ("x==a==b", "found '==', expected: ',' or 'end of string'"),
            ("!x=a", "found '=', expected: ',' or 'end of string'"),
            (",x,y", "found ',', expected: !, identifier, or 'end of string'"),
            ("a in (xyz),", "found '', expected: identifier after ','"),
            ("a in (xyz)b notin ()", "found 'b', expected: ',' or 'end of string'"),
            ("x nott in (y)", "found 'nott', expected: '=', '!=', '==', 'in', 'notin'"),
            ("a (", "unable to parse requirement: found '(', expected: '=', '!=', '==', 'in', 'notin', '>', '<'"),
            ("(", "found '(', expected: !, identifier, or 'end of string'"),
            ("a notin(", "unable to parse requirement: found '', expected: ',', ')' or identifier"),
            ("a in (xyz abc)", "unable to parse requirement: found 'abc', expected: ',' or ')'"),
            ("a in (x,=)", "unable to parse requirement: found '=', expected: ',', or identifier"),
            ("a in x", "unable to parse requirement: found 'x', expected: '('"),
            ("x=(", "unable to parse requirement: found '(', expected: identifier"),
            ("!", "unable to parse requirement: found '', expected: identifier"),
            ("!=a", "found '!=', expected: !, identifier, or 'end of string'"),
        ] {
            match LabelSelector::parse(input) {
                Ok(s) => panic!("{input}: parsed as {s}"),
                Err(e) => assert!(e.to_string().contains(want), "{input}: {e}"),
            }
        }
    }

    #[test]
    fn validates_keys_and_values() {
        assert_eq!(label_err("app=a b"), "found 'b', expected: ',' or 'end of string'");
        let err = label_err("app in (a b)");
        assert_eq!(err, "unable to parse requirement: found 'b', expected: ',' or ')'");
        let err = label_err("app=-bad");
        assert!(
            err.starts_with(
                "unable to parse requirement: invalid label value: \"-bad\": at key: \"app\": a valid label must be"
            ),
            "{err}"
        );
        let err = label_err("-app=x");
        assert!(err.starts_with("unable to parse requirement: invalid label key \"-app\": name part"), "{err}");
        // The key is checked before the operator, as upstream does.
        assert!(label_err("a/b/c (").contains("invalid label key \"a/b/c\""));
        assert!(label_err("!-x").contains("invalid label key \"-x\""));
        assert!(label_err(&format!("x={}", "a".repeat(64))).contains("no more than 63"));
        assert!(LabelSelector::parse("example.com/My_Key.x=V-1.2_3").is_ok());
    }

    #[test]
    fn greater_and_less_than() {
        assert!(matches("x>1", json!({"x": "2"})));
        assert!(matches("x<1", json!({"x": "0"})));
        assert!(!matches("x>1", json!({"x": "0"})));
        assert!(!matches("x<1", json!({"x": "2"})));
        assert!(!matches("x>1", json!({"x": "1"})));
        assert!(!matches("x>1", json!({"x": "v2"})));
        assert!(!matches("x>1", json!({})));
        assert!(!matches("x<1", json!({})));
        assert_eq!(
            label_err("x<a"),
            "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer"
        );
        assert!(label_err("x>").contains("must be an integer"));
        assert!(label_err("x>-1").contains("invalid label value"));
    }

    #[test]
    fn equality_and_existence() {
        assert!(matches("", json!({"x": "y"})));
        assert!(matches("x=y", json!({"x": "y"})));
        assert!(matches("x==y", json!({"x": "y"})));
        assert!(matches("x=y,z=w", json!({"x": "y", "z": "w"})));
        assert!(matches("x!=y,z!=w", json!({"x": "z", "z": "a"})));
        assert!(matches("notin=in", json!({"notin": "in"})));
        assert!(matches("x", json!({"x": "z"})));
        assert!(matches("x", json!({"x": ""})));
        assert!(matches("!x", json!({"y": "z"})));
        assert!(matches("x=", json!({"x": ""})));
        assert!(!matches("x=", json!({})));
        assert!(!matches("x=z", json!({})));
        assert!(!matches("x=y", json!({"x": "z"})));
        assert!(!matches("x=y,z=w", json!({"x": "w", "z": "w"})));
        assert!(!matches("x!=y,z!=w", json!({"x": "z", "z": "w"})));
        assert!(!matches("x", json!({"y": "z"})));
        assert!(!matches("!x", json!({"x": "z"})));
        assert!(!matches("foo=bar,foobar=bar", json!({"foo": "bar"})));
    }

    #[test]
    fn negative_operators_match_missing_keys() {
        assert!(matches("x!=a", json!({})));
        assert!(matches("x notin (a,b)", json!({"y": "a"})));
        assert!(!matches("x notin (a,b)", json!({"x": "b"})));
        assert!(matches("x notin (a,b)", json!({"x": "c"})));
        let selector = LabelSelector::parse("x!=a,!y").map_err(|e| e.to_string());
        assert_eq!(selector.map(|s| s.matches(None)), Ok(true));
    }

    #[test]
    fn set_membership() {
        assert!(matches("x in (a,b)", json!({"x": "b"})));
        assert!(!matches("x in (a,b)", json!({"x": "c"})));
        assert!(!matches("x in (a,b)", json!({})));
        // `()` is the set holding only the empty value.
        assert!(matches("x in ()", json!({"x": ""})));
        assert!(!matches("x in ()", json!({"x": "a"})));
        assert!(!matches("x in ()", json!({})));
        assert!(matches("x notin ()", json!({"x": "a"})));
        assert!(!matches("x notin ()", json!({"x": ""})));
        assert!(matches("x in (a,)", json!({"x": ""})));
    }

    #[test]
    fn non_string_labels_are_absent() {
        assert!(!matches("x", json!({"x": 1})));
        assert!(matches("!x", json!({"x": null})));
    }

    #[test]
    fn empty_selects_everything() {
        let all = LabelSelector::default();
        assert!(all.is_empty());
        assert!(all.matches(None));
        assert_eq!(all.to_string(), "");
        assert_eq!(LabelSelector::parse("  "), Ok(LabelSelector::default()));
        assert!(!LabelSelector::parse("x").is_ok_and(|s| s.is_empty()));
    }

    fn field(s: &str) -> FieldSelector {
        match FieldSelector::parse(s) {
            Ok(s) => s,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    fn field_err(s: &str) -> String {
        match FieldSelector::parse(s) {
            Ok(sel) => panic!("{s}: parsed as {sel}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn field_selectors_parse_and_restring() {
        for s in ["x=a,y=b,z=c", "", "x!=a,y=b", r"x=a||y\=b", r"x=a\=\=b", "a=", "목=록,함=수"] {
            assert_eq!(field(s).to_string(), s, "{s}");
        }
        assert_eq!(field("x=a,a=x").to_string(), "a=x,x=a");
        assert_eq!(field("함=수,목=록").to_string(), "목=록,함=수");
        assert_eq!(field("x==a").to_string(), "x=a");
        assert_eq!(field(",x=a,").to_string(), "x=a");
        assert_eq!(field("a!=b").to_string(), "a!=b");
        // No whitespace is trimmed, as upstream.
        assert_eq!(field("f = v").fields().collect::<Vec<_>>(), ["f "]);
        assert!(field("").is_empty());
        assert!(!field("a=b").is_empty());
        assert_eq!(FieldSelector::default(), field(""));
    }

    #[test]
    fn field_selector_escaping() {
        let s = field(r"complex=\=value\\\,\\,k=\,");
        assert_eq!(s.exact("complex"), Some(r"=value\,\"));
        assert_eq!(s.exact("k"), Some(","));
        assert_eq!(s.to_string(), r"complex=\=value\\\,\\,k=\,");
        // A value may contain '!' and other characters unescaped.
        assert_eq!(field("a=b!c").exact("a"), Some("b!c"));
        assert_eq!(field("a!=!").to_string(), "a!=!");
        assert_eq!(field(r"k=\\,k2=v2").exact("k"), Some(r"\"));
        assert_eq!(field(r"k=\\,k2=v2").exact("k2"), Some("v2"));
    }

    #[test]
    fn field_selector_errors() {
        assert_eq!(field_err("x"), "invalid selector: 'x'; can't understand 'x'");
        assert_eq!(field_err("a=b,x in (a)"), "invalid selector: 'a=b,x in (a)'; can't understand 'x in (a)'");
        assert_eq!(field_err("x==a==b"), "invalid field selector: unescaped character in value: '='");
        assert_eq!(field_err("x=a,b"), "invalid selector: 'x=a,b'; can't understand 'b'");
        assert_eq!(field_err(r"k=\a"), r"invalid field selector: invalid escape sequence: \a");
        assert_eq!(field_err(r"k=\"), r"invalid field selector: invalid escape sequence: \");
        assert_eq!(field_err(r"k=\\\"), r"invalid field selector: invalid escape sequence: \");
        assert_eq!(field_err(r"k=\!"), r"invalid field selector: invalid escape sequence: \!");
    }

    #[test]
    fn field_selector_matches() {
        let object = |f: &str| match f {
            "metadata.name" => Some("web".to_string()),
            "status.phase" => Some("Running".to_string()),
            "spec.nodeName" => Some(String::new()),
            _ => None,
        };
        assert!(field("").matches(object));
        assert!(field("metadata.name=web").matches(object));
        assert!(field("metadata.name==web,status.phase!=Pending").matches(object));
        assert!(!field("metadata.name=db").matches(object));
        assert!(!field("status.phase!=Running").matches(object));
        assert!(field("spec.nodeName=").matches(object));
        assert!(!field("spec.nodeName!=").matches(object));
        // Unknown fields read as the empty string.
        assert!(field("unknown=").matches(object));
        assert!(field("unknown!=x").matches(object));
        assert!(!field("unknown=x").matches(object));
    }

    #[test]
    fn field_selector_exact_and_fields() {
        let s = field("metadata.namespace=ns,metadata.name=web,status.phase!=Failed");
        assert_eq!(s.exact("metadata.name"), Some("web"));
        assert_eq!(s.exact("metadata.namespace"), Some("ns"));
        assert_eq!(s.exact("status.phase"), None);
        assert_eq!(s.exact("spec.nodeName"), None);
        assert_eq!(field("metadata.name==").exact("metadata.name"), Some(""));
        assert_eq!(field("").exact("metadata.name"), None);
        assert_eq!(s.fields().collect::<Vec<_>>(), ["metadata.name", "metadata.namespace", "status.phase"]);
    }
}
