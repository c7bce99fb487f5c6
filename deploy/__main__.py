from lj_runtimekit.deploy.cli import main

raise SystemExit(main())
