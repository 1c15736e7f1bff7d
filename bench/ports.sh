# bench/ports.sh — sourced by the bench scripts (compare.sh, tls.sh, jwt.sh, compression.sh,
# instructions.sh): picks the ports of a
# run's servers on 127.0.0.1.
#
#   free_port VAR    sets VAR to a port nothing listens on, below the kernel's ephemeral range
#                    (net.ipv4.ip_local_port_range), so that no client connection of the run
#                    (wrk's, a proxy's to its upstream) holds it as its local port when a server
#                    binds it later; never the same port twice in one script. Call it without
#                    $(...): a subshell would forget the ports already given.
#
# The sourcing script defines die().

USED_PORTS=" "
EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
((EPHEMERAL_LOW > 12000)) || EPHEMERAL_LOW=32768

free_port() {
    local p
    for _ in $(seq 200); do
        p=$((10000 + RANDOM % (EPHEMERAL_LOW - 10000)))
        [[ $USED_PORTS == *" $p "* ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            USED_PORTS+="$p "
            printf -v "$1" '%s' "$p"
            return 0
        fi
    done
    die "no free port found"
}
