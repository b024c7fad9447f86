//! `--help` for `serve` and `config`: each flag's default and the TOML key it sets, taken
//! from the embedded defaults (`NodeConfig::default()`) when the command line is built, so
//! the help cannot drift from what a cell really runs with.

use cellcache_node::config::NodeConfig;

/// Flag id (the `ServeArgs` field) → the TOML key it sets. A test checks every flag of
/// `serve` is here.
const KEYS: &[(&str, &str)] = &[
    ("config", ""),
    ("listen", "server.listen"),
    ("port", "server.port"),
    ("threads", "io.threads"),
    ("listen_backlog", "io.listen_backlog"),
    ("max_connections", "io.max_connections"),
    ("memory_limit", "store.memory_limit_bytes"),
    ("max_item_size", "store.item_size_max_bytes"),
    ("enable_shutdown", "server.shutdown_command"),
    ("disable_flush_all", "server.flush_enabled"),
    ("disable_evictions", "store.evictions"),
    ("eviction", "store.eviction"),
    ("auto_switch", "switching.auto"),
    ("disable_cas", "store.cas_enabled"),
    ("max_reqs_per_event", "server.requests_per_event_max"),
    ("detail_delimiter", "server.detail_delimiter"),
    ("protocol", "server.binding_protocol"),
    ("auth_file", "server.auth_file"),
    ("enable_ssl", "server.tls.enabled"),
    ("extended", ""),
    ("io_engine", "server.io_engine"),
    ("idle_timeout", "io.idle_timeout_secs"),
    ("log_level", "log.level"),
    ("log_format", "log.format"),
    ("join", "cluster.join"),
    ("peer_port", "cluster.peer_port"),
    ("standby", "cluster.standby"),
    ("cluster_secret_file", "cluster.secret_file"),
    ("peer_tls_cert", "cluster.tls.cert_file"),
    ("peer_tls_key", "cluster.tls.key_file"),
    ("peer_tls_ca", "cluster.tls.ca_file"),
    ("dns_port", "dns.port"),
    ("cluster_name", "dns.name"),
    ("admin_port", "admin.port"),
    ("admin_listen", "admin.listen"),
    ("admin_token_file", "admin.token_file"),
    ("state_dir", "cluster.state_dir"),
    ("standalone", "cluster.enabled"),
    ("backing_store", "tier.backing_store"),
    ("write_policy", "tier.write_policy"),
    ("write_back_window", "tier.write_back_window_ms"),
    ("write_back_max_dirty", "tier.write_back_max_dirty_bytes"),
    ("verbose", "log.level"),
    ("autoscale", "autoscale.enabled"),
    ("provisioner", "autoscale.provisioner"),
    ("high_water", "autoscale.high_water"),
    ("low_water", "autoscale.low_water"),
    ("scale_window", "autoscale.window_ms"),
    ("cooldown", "autoscale.cooldown_ms"),
    ("min_cells", "autoscale.min_cells"),
    ("max_cells", "autoscale.max_cells"),
    ("divide", "cluster.divide"),
    ("provisioned", "cluster.provisioned"),
];

/// What the default of flag `id` reads as, in the flag's own units.
fn default_of(id: &str, key: &str, defaults: &toml::Table) -> String {
    let config = NodeConfig::default();
    match id {
        "config" => return "none (embedded defaults)".into(),
        "memory_limit" => return (config.store.memory_limit_bytes >> 20).to_string(),
        "max_item_size" => {
            let item = config.store.item_size_max_bytes;
            return if item % (1 << 20) == 0 {
                format!("{}m", item >> 20)
            } else {
                item.to_string()
            };
        }
        "standalone" => return "off (a ring member)".into(),
        "disable_flush_all" => return "off (flush_all allowed)".into(),
        "disable_evictions" => return "off (evict)".into(),
        "disable_cas" => return "off (CAS on)".into(),
        "extended" => return "none".into(),
        "detail_delimiter" => return "':' with counts off (server.detail_enabled)".into(),
        "verbose" => return format!("off (log.level {})", config.log.level),
        "peer_port" if config.cluster.peer_port == 0 => return "client port + 10000".into(),
        "admin_port" if config.admin.port == 0 => return "client port + 20000".into(),
        "dns_port" if config.dns.port == 0 => return "none: no DNS".into(),
        "admin_token_file" if config.admin.token_file.is_empty() => {
            return "none: loopback only".into();
        }
        "state_dir" if config.cluster.state_dir.is_empty() => {
            return "$XDG_STATE_HOME/cellcache or ~/.local/state/cellcache".into();
        }
        "join" if config.cluster.join.is_empty() => return "none: bootstrap a ring of one".into(),
        "backing_store" if config.tier.backing_store.is_empty() => {
            return "none: a plain cache".into();
        }
        "scale_window" => return format!("{}s", config.autoscale.window_ms / 1000),
        "cooldown" => return format!("{}s", config.autoscale.cooldown_ms / 1000),
        "divide" if config.cluster.divide.is_empty() => {
            return "none: the cell with the largest range".into();
        }
        "auth_file" if config.server.auth_file.is_empty() => {
            return "none: clients need no login".into();
        }
        "cluster_secret_file" if config.cluster.secret_file.is_empty() => {
            return "none: the peer port is open (docs/security.md)".into();
        }
        "peer_tls_cert" | "peer_tls_key" | "peer_tls_ca" if !config.cluster.tls.enabled() => {
            return "none: peer traffic in plain TCP".into();
        }
        _ => {}
    }
    let mut value = toml::Value::Table(defaults.clone());
    for part in key.split('.') {
        value = value
            .get(part)
            .cloned()
            .unwrap_or(toml::Value::String("?".into()));
    }
    match value {
        toml::Value::String(s) if s.is_empty() => "none".into(),
        toml::Value::String(s) => s,
        toml::Value::Boolean(false) => "off".into(),
        toml::Value::Boolean(true) => "on".into(),
        other => other.to_string(),
    }
}

/// Appends `[default: …] [toml: …]` to the help of every flag of `cmd` (a `serve`-like
/// command built from `ServeArgs`).
pub fn annotate_serve(cmd: clap::Command) -> clap::Command {
    let defaults: toml::Table = toml::to_string(&NodeConfig::default())
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_default();
    let mut cmd = cmd;
    for (id, key) in KEYS {
        let default = default_of(id, key, &defaults);
        cmd = cmd.mut_arg(*id, |arg| {
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let toml = if key.is_empty() {
                String::new()
            } else {
                format!(" [toml: {key}]")
            };
            arg.help(format!("{help} [default: {default}]{toml}"))
        });
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_serve_flag_shows_its_default_and_toml_key() {
        let cmd = annotate_serve(
            crate::Cli::command()
                .find_subcommand("serve")
                .unwrap()
                .clone(),
        );
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(
                help.contains("[default: "),
                "--{id} shows no default: {help}"
            );
            assert!(
                ["config", "extended"].contains(&id) || help.contains("[toml: "),
                "--{id} shows no TOML key: {help}"
            );
            assert!(!help.contains("[default: ?]"), "--{id}: {help}");
        }
        let port = cmd.get_arguments().find(|a| a.get_id() == "port").unwrap();
        assert!(
            port.get_help()
                .unwrap()
                .to_string()
                .contains("[default: 11211] [toml: server.port]")
        );
        let m = cmd
            .get_arguments()
            .find(|a| a.get_id() == "memory_limit")
            .unwrap();
        assert!(m.get_help().unwrap().to_string().contains("[default: 64]"));
        let r = cmd
            .get_arguments()
            .find(|a| a.get_id() == "max_reqs_per_event")
            .unwrap();
        assert!(
            r.get_help()
                .unwrap()
                .to_string()
                .contains("[default: 20] [toml: server.requests_per_event_max]")
        );
    }
}
