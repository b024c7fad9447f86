//! `ctl`'s text renderings of the admin plane's JSON replies.

use anyhow::Context;

/// `ctl switch --list`: the admin plane's JSON as is, or one line per block.
pub(super) fn switch_list(body: &str, json: bool) -> anyhow::Result<String> {
    if json {
        return Ok(body.to_string());
    }
    let blocks: serde_json::Value = serde_json::from_str(body).context("the /switch reply")?;
    let mut out = String::new();
    for (block, v) in blocks.as_object().into_iter().flatten() {
        let available: Vec<&str> = v["available"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str())
            .collect();
        let current = v["current"].as_str().unwrap_or("?");
        out += &format!("{block} {current} (available: {})\n", available.join(", "));
    }
    Ok(out)
}

/// `ctl autoswitch status`: the admin plane's JSON as lines — `AUTOSWITCH on|off eviction
/// <policy> switches <n>`, `SIGNAL …` (the last window), `VERDICT …`, one `SWITCHED …` per
/// recent switch.
pub(super) fn autoswitch_text(body: &str) -> anyhow::Result<String> {
    let st: serde_json::Value = serde_json::from_str(body).context("the /autoswitch reply")?;
    let mut out = format!(
        "AUTOSWITCH {} eviction {} switches {}\n",
        if st["enabled"].as_bool() == Some(true) {
            "on"
        } else {
            "off"
        },
        st["eviction"].as_str().unwrap_or("?"),
        st["switches"]
    );
    let pct = |v: &serde_json::Value| format!("{:.1}%", v.as_f64().unwrap_or(0.0) * 100.0);
    let signal = &st["signal"];
    if !signal.is_null() {
        out += &format!(
            "SIGNAL window_ms {} evicted {} unread_evicted {} ghost_hits {}\n",
            signal["window_ms"],
            signal["evicted"],
            pct(&signal["unread_evicted"]),
            pct(&signal["ghost_hits"])
        );
    }
    if let Some(reason) = st["verdict"]["reason"].as_str() {
        out += &format!("VERDICT {reason}\n");
    }
    for e in st["events"].as_array().into_iter().flatten() {
        out += &format!(
            "SWITCHED at {} {} {} -> {}: {}\n",
            e["at"],
            e["block"].as_str().unwrap_or("?"),
            e["from"].as_str().unwrap_or("?"),
            e["to"].as_str().unwrap_or("?"),
            e["reason"].as_str().unwrap_or("")
        );
    }
    Ok(out)
}
