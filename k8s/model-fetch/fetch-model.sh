#!/bin/sh
# Copy a Flint checkpoint from object storage into $DEST_DIR (default /models) with rclone.
#
# Used by the init container of k8s/components/object-store-weights (into an emptyDir) and by the Job in
# k8s/storage (into a PVC). Settings come from the flint-model-source ConfigMap:
#   MODEL_URI             s3://bucket/key, gs://bucket/key, az://container/key or https://host/path; a single file
#                         (flint-nvfp4.gguf) or a directory (an HF checkpoint). Required.
#   MODEL_SHA256          optional sha256 of a single-file checkpoint; checked after the copy.
#   S3_ENDPOINT           optional endpoint for S3-compatible stores (MinIO, R2, Ceph); S3_PROVIDER (default AWS).
#   AZURE_STORAGE_ACCOUNT the storage account for az:// URIs.
# Credentials are never in the ConfigMap: rclone's env_auth picks up workload identity (IRSA, GKE/AKS workload
# identity) or the standard variables (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_KEY ...)
# from the optional Secret flint-model-store-credentials.
# The copy is written under a temporary name and renamed when complete, so a half-copied checkpoint is never
# loaded; an already complete copy is kept (restarts of the pod's containers do not download again).
set -eu

uri="${MODEL_URI:-}"
dest="${DEST_DIR:-/models}"
if [ -z "$uri" ]; then
    echo "fetch-model: MODEL_URI is empty; set it in the flint-model-source ConfigMap" >&2
    exit 2
fi

path="${uri#*://}"
name="$(basename "${path%/}")"
case "$uri" in
    s3://*)
        remote=":s3,provider=${S3_PROVIDER:-AWS},env_auth=true"
        if [ -n "${S3_ENDPOINT:-}" ]; then remote="$remote,endpoint=$S3_ENDPOINT"; fi
        src="$remote:$path"
        ;;
    gs://*)
        src=":gcs,env_auth=true,bucket_policy_only=true:$path"
        ;;
    az://*)
        src=":azureblob,env_auth=true,account=${AZURE_STORAGE_ACCOUNT:?AZURE_STORAGE_ACCOUNT is needed for az://}:$path"
        ;;
    https://*|http://*)
        export RCLONE_HTTP_URL="${uri%/*}/"
        src=":http:$name"
        ;;
    *)
        echo "fetch-model: unsupported MODEL_URI scheme: $uri (use s3://, gs://, az:// or https://)" >&2
        exit 2
        ;;
esac

target="$dest/$name"
marker="$dest/.$name.complete"
if [ -e "$target" ] && [ -f "$marker" ]; then
    echo "fetch-model: $target is already complete"
    exit 0
fi

partial="$dest/.$name.partial"
rm -rf "$partial" "$marker"
flags="--transfers=8 --multi-thread-streams=16 --stats=30s --stats-one-line --retries=5 --low-level-retries=20"
echo "fetch-model: copying $uri to $target"
# lsjson --stat tells a single object from a prefix (an HF checkpoint directory).
if rclone lsjson --stat "$src" 2>/dev/null | grep -q '"IsDir":[[:space:]]*true'; then
    # shellcheck disable=SC2086
    rclone copy $flags "$src" "$partial"
else
    # shellcheck disable=SC2086
    rclone copyto $flags "$src" "$partial"
    if [ -n "${MODEL_SHA256:-}" ]; then
        echo "$MODEL_SHA256  $partial" | sha256sum -c -
    fi
fi
rm -rf "$target"
mv "$partial" "$target"
touch "$marker"
echo "fetch-model: done: $(du -sh "$target" | cut -f1) in $target"
