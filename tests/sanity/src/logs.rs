//! Checks of the plugins' JSON logs, as a strict consumer reads them:
//! every line one JSON object, and no object with a key twice (most
//! parsers keep the last of two equal keys, silently losing the first).

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Any JSON value, refused when an object in it repeats a key.
struct UniqueKeys;

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("key {key:?} appears twice")));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}

/// Whether `line` is one JSON object whose objects all have unique keys.
pub fn check_json_line(line: &str) -> Result<(), String> {
    if !line.trim_start().starts_with('{') {
        return Err("not a JSON object".into());
    }
    serde_json::from_str::<UniqueKeys>(line)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Every problem in a JSON log: `(line number, problem, line)`.
pub fn check_json_log(text: &str) -> Vec<(usize, String, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .filter_map(|(i, l)| check_json_line(l).err().map(|e| (i + 1, e, l.to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_are_found_at_any_depth() {
        assert!(check_json_line(r#"{"a":1,"b":{"c":[1,{"d":2}]}}"#).is_ok());
        assert!(check_json_line(r#"{"a":1,"a":2}"#).is_err());
        assert!(check_json_line(r#"{"span":{"name":"pvc-1","name":"CreateVolume"}}"#).is_err());
        assert!(check_json_line(r#"{"s":[{"x":1,"x":1}]}"#).is_err());
        assert!(check_json_line("plain text").is_err());
    }
}
