-- wrk script for bench/compare.sh: prints one machine-readable line at the end of a run.
-- It defines only done(), so wrk does not call into Lua per request (no `response` hook):
-- the client costs the same as a plain `wrk` run. Status codes are still checked: wrk counts
-- every response outside 2xx/3xx in summary.errors.status.
function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "WRKRESULT requests=%.0f duration_us=%.0f p50_us=%.0f p99_us=%.0f non2xx=%.0f connect=%.0f read=%.0f write=%.0f timeout=%.0f\n",
      summary.requests, summary.duration,
      latency:percentile(50), latency:percentile(99),
      e.status, e.connect, e.read, e.write, e.timeout))
end
