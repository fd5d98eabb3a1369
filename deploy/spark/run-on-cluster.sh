#!/bin/sh
# Run rmq-polling-report on a Spark cluster with spark-submit, unchanged from the local job.
#
#   deploy/spark/run-on-cluster.sh MASTER EVENTS_URI OUT_URI [job options...]
#
# e.g.
#   deploy/spark/run-on-cluster.sh spark://spark-master:7077 \
#       hdfs:///rmq/events hdfs:///rmq/aggregates --date 2024-05-01 \
#       --pushgateway http://pushgateway:9091
#   deploy/spark/run-on-cluster.sh yarn s3a://bucket/rmq/events s3a://bucket/rmq/aggregates
#
# The job's code ships as one zip (--py-files) of its package, analytics/polling_report,
# and the proxy's package (the recommendation reads the proxy's defaults from proxy.config,
# standard library only; nothing else of the proxy is imported). The driver's Python (client
# mode: on this host; PYSPARK_DRIVER_PYTHON) needs PySpark of the cluster's version and
# prometheus-client (--pushgateway), neither of our packages. The executors run no code of
# ours: only PySpark's own Python worker, for the empty DataFrame the first micro-batch of
# a stream merges into when there is no output yet. That runs the PYSPARK_PYTHON set where
# the job is submitted (default python3 on the worker hosts' PATH), of the driver's Python
# minor version; it needs no package installed.
# Every option of `rmq-polling-report --help` passes through; --master is spark-submit's.
# SPARK_SUBMIT_EXTRA adds spark-submit options, e.g. for s3a:// the hadoop-aws package
# matching the cluster's Hadoop:
#   SPARK_SUBMIT_EXTRA="--packages org.apache.hadoop:hadoop-aws:3.4.1"
set -eu

if [ $# -lt 3 ]; then
    sed -n '2,24p' "$0"
    exit 2
fi
master=$1 events=$2 out=$3
shift 3

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT

# The packages as a zip on the driver's (and the executors') Python path.
(cd "$repo/analytics" && zip -qr "$build/rmq_analytics.zip" polling_report -i '*.py')
(cd "$repo" && zip -qr "$build/rmq_analytics.zip" proxy -i '*.py')

# shellcheck disable=SC2086  # SPARK_SUBMIT_EXTRA is a list of options
"${SPARK_SUBMIT:-spark-submit}" \
    --master "$master" \
    --deploy-mode "${DEPLOY_MODE:-client}" \
    --properties-file "$here/spark-defaults.conf" \
    --py-files "$build/rmq_analytics.zip" \
    ${SPARK_SUBMIT_EXTRA:-} \
    "$here/submit_main.py" "$events" --out "$out" "$@"
