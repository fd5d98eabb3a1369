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
# The job's code ships as a zip of its package, analytics/polling_report (its Python
# dependency there is prometheus-client, on the driver only, for --pushgateway). Every option of `rmq-polling-report --help` passes through; --master is
# spark-submit's. For s3a:// add the hadoop-aws package matching the cluster's Hadoop, e.g.
#   SPARK_SUBMIT_EXTRA="--packages org.apache.hadoop:hadoop-aws:3.4.1"
set -eu

if [ $# -lt 3 ]; then
    sed -n '2,20p' "$0"
    exit 2
fi
master=$1 events=$2 out=$3
shift 3

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT

# The package as a zip for the executors' and the driver's Python path.
(cd "$repo/analytics" && zip -qr "$build/rmq_analytics.zip" polling_report -i '*.py')

# shellcheck disable=SC2086  # SPARK_SUBMIT_EXTRA is a list of options
"${SPARK_SUBMIT:-spark-submit}" \
    --master "$master" \
    --deploy-mode "${DEPLOY_MODE:-client}" \
    --properties-file "$here/spark-defaults.conf" \
    --py-files "$build/rmq_analytics.zip" \
    ${SPARK_SUBMIT_EXTRA:-} \
    "$here/submit_main.py" "$events" --out "$out" "$@"
