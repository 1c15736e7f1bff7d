# bench/scale-config.sh — sourced by compare.sh (its scale block) and idle-rss.sh: the configs
# of Tollgate with many routes.
#
#   allow_limits                         the /allow limits (never reached), as [[routes.limits]]
#   scale_config PORT ADMIN DUMMY-ROUTES  the scale block's gateway.toml on stdout
#
# The sourcing script sets UP_PORT (the upstream every route names).

# The /allow limits (never reached): the benchmarked route and the scale block's catch-all.
allow_limits() {
    cat <<EOF
[[routes.limits]]
name = "per-ip"
algorithm = "gcra"
limit = 1000000
period = "1s"
subject = "ip"

[[routes.limits]]
name = "global"
algorithm = "fixed_window"
limit = 1000000000
period = "1s"
subject = "global"
EOF
}

# The scale block's config: one catch-all route with the /allow limits, alone or behind N dummy
# routes /svcI/api (one limit each, never requested), all to http://127.0.0.1:$UP_PORT.
scale_config() { # scale_config PORT ADMIN DUMMY-ROUTES
    cat <<EOF
[server]
listen = "127.0.0.1:$1"

[admin]
listen = "127.0.0.1:$2"

[store]
backend = "memory"
EOF
    awk -v n="$3" -v up="http://127.0.0.1:$UP_PORT" 'BEGIN {
        for (i = 0; i < n; i++)
            printf "\n[[routes]]\nname = \"svc%d\"\npath_prefix = \"/svc%d/api\"\nupstream = \"%s\"\n\n[[routes.limits]]\nname = \"per-ip\"\nalgorithm = \"gcra\"\nlimit = 100\nperiod = \"1s\"\nsubject = \"ip\"\n", i, i, up
    }'
    cat <<EOF

[[routes]]
name = "catch-all"
path_prefix = "/"
upstream = "http://127.0.0.1:$UP_PORT"

$(allow_limits)
EOF
}
