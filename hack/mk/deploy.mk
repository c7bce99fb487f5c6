# Deployment. Included by the top-level Makefile.

##@ Deploy

.PHONY: manifests
manifests: ## Regenerate deploy/ plain YAML, kustomizations and Helm chart (lj-deploy generate)
	$(UV) run lj-deploy generate --deploy-dir deploy

.PHONY: check-manifests
check-manifests: ## Fail when a generated deploy file is stale
	$(UV) run lj-deploy generate --deploy-dir deploy --check

.PHONY: docker
docker: ## Build every component image (deploy/docker/build.sh: Docker, else buildah; digests in dist/images.json)
	$(MAKE) -C deploy docker

.PHONY: deploy
deploy: ## Deploy every component: deploy/deploy-all.sh deploy $(DEPLOY_ARGS)
	bash deploy/deploy-all.sh deploy $(DEPLOY_ARGS)
