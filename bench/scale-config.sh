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

# The N dummy routes: /svcI/api prefixes, or with SCALE_MIX=mixed every kind (below).
dummy_routes() { # dummy_routes N
    if [[ ${SCALE_MIX:-prefix} == mixed ]]; then
        mixed_routes "$1"
    else
        awk -v n="$1" -v up="http://127.0.0.1:$UP_PORT" 'BEGIN {
            for (i = 0; i < n; i++)
                printf "\n[[routes]]\nname = \"svc%d\"\npath_prefix = \"/svc%d/api\"\nupstream = \"%s\"\n\n[[routes.limits]]\nname = \"per-ip\"\nalgorithm = \"gcra\"\nlimit = 100\nperiod = \"1s\"\nsubject = \"ip\"\n", i, i, up
        }'
    fi
}

# SCALE_MIX=mixed: the dummy routes are of every kind (issue #51's scale target): of every 20,
# one `path_regex` (5 %), six exact `path`s, six `path_template`s and seven `path_prefix`es; one
# in 10 with a header matcher; every other one on a host, over 1,000 hosts of which 100 are
# wildcards (`*.wK.scale.test`). Each has one GCRA limit; none is ever requested.
mixed_routes() { # mixed_routes N
    awk -v n="$1" -v up="http://127.0.0.1:$UP_PORT" 'BEGIN {
        for (i = 0; i < n; i++) {
            k = i % 20
            if (k == 0) m = sprintf("path_regex = \"/re%d/[0-9]+\"", i)
            else if (k <= 6) m = sprintf("path = \"/ex%d/login\"", i)
            else if (k <= 12) m = sprintf("path_template = \"/tp%d/{id}/x\"", i)
            else m = sprintf("path_prefix = \"/svc%d/api\"", i)
            h = ""
            if (i % 2 == 0) {
                j = (i / 2) % 1000
                if (j < 100) h = sprintf("host = \"*.w%d.scale.test\"\n", j)
                else h = sprintf("host = \"h%d.scale.test\"\n", j)
            }
            hd = ""
            if (i % 10 == 5) hd = sprintf("[[routes.headers]]\nname = \"x-tenant\"\nvalue = \"t%d\"\n", i)
            printf "\n[[routes]]\nname = \"svc%d\"\n%s\n%supstream = \"%s\"\n%s\n[[routes.limits]]\nname = \"per-ip\"\nalgorithm = \"gcra\"\nlimit = 100\nperiod = \"1s\"\nsubject = \"ip\"\n", i, m, h, up, hd
        }
    }'
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
    dummy_routes "$3"
    cat <<EOF

[[routes]]
name = "catch-all"
path_prefix = "/"
upstream = "http://127.0.0.1:$UP_PORT"

$(allow_limits)
EOF
}
