from bench.routers.run import main

raise SystemExit(main())
