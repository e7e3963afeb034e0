//! Times as the API server writes them.

use std::time::SystemTime;

/// RFC 3339 UTC time of `t` (seconds precision).
pub fn rfc3339(t: SystemTime) -> String {
    let nanos = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    k8s_openapi::jiff::Timestamp::from_second(nanos)
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40Z");
    }
}
